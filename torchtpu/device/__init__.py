"""The "tpu" device: registration with PyTorch and the torch.tpu module."""

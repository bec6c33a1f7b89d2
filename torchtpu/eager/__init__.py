"""Executors that run ATen ops on the device."""

"""Hugging Face on tpu as on cuda (issue 15): Accelerate's device_map and a default Trainer."""
import pytest
import torch

import torchtpu  # noqa: F401
from conftest import assert_same, assert_values

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

CFG = dict(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
           max_position_embeddings=32, num_labels=2,
           # dropout draws from each device's own generator: off, so the runs can be compared
           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from transformers import BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(**CFG)).save_pretrained(path)
    return path


def test_from_pretrained_with_device_map_tpu(saved):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(saved, device_map="tpu")
    ref = AutoModel.from_pretrained(saved)
    assert {p.device.type for p in model.parameters()} == {"tpu"}
    ids = torch.randint(0, CFG["vocab_size"], (2, 7))
    assert_same(model(ids.to("tpu")).last_hidden_state, ref(ids).last_hidden_state,
                               atol=1e-5, rtol=1e-5)


class _Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, CFG["vocab_size"], (40, 12), generator=g)
        self.y = torch.randint(0, 2, (40,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.y[i]}


def _train(saved, out, **kwargs):
    from transformers import BertForSequenceClassification, Trainer, TrainingArguments

    model = BertForSequenceClassification.from_pretrained(saved)
    args = TrainingArguments(output_dir=str(out), max_steps=5, seed=0, report_to=[], logging_steps=1,
                             disable_tqdm=True, **kwargs)
    trainer = Trainer(model=model, args=args, train_dataset=_Data())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, trainer


def test_trainer_with_default_arguments_matches_cpu(saved, tmp_path):
    transformers.logging.set_verbosity_error()
    cpu_losses, cpu_trainer = _train(saved, tmp_path / "cpu", use_cpu=True)
    assert cpu_trainer.accelerator.device.type == "cpu"  # use_cpu=True still means the CPU
    losses, trainer = _train(saved, tmp_path / "tpu")  # default arguments: the device is chosen for us
    assert trainer.args.device.type == "tpu" and trainer.accelerator.device.type == "tpu"
    assert {p.device.type for p in trainer.model.parameters()} == {"tpu"}
    assert len(losses) == len(cpu_losses) == 5
    assert_values(losses, cpu_losses, atol=1e-5, rtol=1e-4)  # the losses the Trainers logged

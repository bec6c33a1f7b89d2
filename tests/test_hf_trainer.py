"""Hugging Face on tpu as on cuda (issue 15): Accelerate's device_map and a default Trainer."""
import pytest
import torch

import torchtpu  # noqa: F401

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
    torch.testing.assert_close(model(ids.to("tpu")).last_hidden_state.cpu(), ref(ids).last_hidden_state,
                               atol=1e-5, rtol=1e-5)

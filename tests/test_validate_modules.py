"""`python -m torchtpu.validate modules`: PyTorch's ModuleInfo inputs on tpu vs CPU."""
import json

import torch

from torchtpu.validate import modules


def test_sweep_of_a_few_modules_matches_cpu(tmp_path):
    # a batch-norm (running stats, train and eval, error inputs), a lazy module (sized by its
    # first forward), the fractional pool whose unbatched input once failed, and a plain Linear
    out = tmp_path / "m.json"
    md = tmp_path / "m.md"
    rc = modules.main(["--modules", "nn.Linear", "nn.BatchNorm1d", "nn.LazyLinear", "nn.FractionalMaxPool3d",
                       "--dtypes", "float32", "--modes", "strict", "--limit", "4",
                       "--json", str(out), "--markdown", str(md)])
    assert rc == 0
    res = json.loads(out.read_text())["results"]
    states = [r["state"] for r in res.values()]
    assert states.count("passed") >= 12
    assert not [k for k, r in res.items() if r["state"] in ("mismatch", "error")]
    assert any("|error|" in k and r["state"] == "passed" for k, r in res.items())  # BatchNorm's error inputs
    assert "| strict |" in md.read_text()


def test_compare_sees_a_wrong_value_a_missing_gradient_and_a_state_difference():
    cpu = ([torch.ones(3)], [torch.ones(2), None], {"running_mean": torch.zeros(2)})
    same = ([torch.ones(3)], [torch.ones(2), None], {"running_mean": torch.zeros(2)})
    assert modules.compare(cpu, same, torch.float32) == []
    wrong = ([torch.tensor([1.0, 1.0, 1.01])], [None, None], {"running_mean": torch.ones(2)})
    names = [n for n, _, _ in modules.compare(cpu, wrong, torch.float32)]
    assert names == ["output0", "grad0", "state[running_mean]"]

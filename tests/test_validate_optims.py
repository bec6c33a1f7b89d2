"""`python -m torchtpu.validate.optims`: PyTorch's OptimizerInfo database on tpu vs CPU.

A small slice of the sweep runs end to end (its JSON has cases and no failures), and the
comparison is shown to catch a wrong tpu result, so the sweep can fail."""
import json

import torch

from torchtpu.validate import optims


def test_sweep_subset(tmp_path):
    out = tmp_path / "x.json"
    md = tmp_path / "x.md"
    rc = optims.main(["--optims", "SGD", "Adagrad", "--dtypes", "float32", "--modes", "strict",
                      "--steps", "2", "--json", str(out), "--markdown", str(md)])
    assert rc == 0
    data = json.loads(out.read_text())
    cases = [c for c in data["cases"] if c["status"] != "skipped"]
    assert {c["optim"] for c in cases} == {"SGD", "Adagrad"}
    kinds = {c["kind"] for c in cases}
    assert kinds == {"run", "scheduler", "error"}, kinds
    assert {c["impl"] for c in cases if c["kind"] == "run"} == {"forloop", "foreach", "fused"}
    failed = [(optims._key(c), c["cause"]) for c in cases if c["status"] == "failed"]
    assert not failed, failed
    fallbacks = [(optims._key(c), c["fallbacks"]) for c in cases if c.get("fallbacks")]
    assert not fallbacks, fallbacks
    assert data["summary"]["SGD"]["cases"] > 0 and data["summary"]["Adagrad"]["cases"] > 0
    assert "| SGD | strict |" in md.read_text()


def test_compare_detects_difference():
    a = {"param:weight": torch.ones(3), "state[weight].step": torch.tensor(2.0), "group0.lr": 0.1}
    same, tol = optims.compare(a, dict(a))
    assert same == [] and tol == "tight"
    # within the relaxed tolerance only
    close = dict(a, **{"param:weight": torch.ones(3) + 5e-5})
    assert optims.compare(a, close) == ([], "relaxed")
    off = dict(a, **{"param:weight": torch.tensor([1.0, 1.5, 1.0])})
    bad, _ = optims.compare(a, off)
    assert [b[0] for b in bad] == ["param:weight"] and abs(bad[0][2] - 0.5) < 1e-6
    nan = dict(a, **{"state[weight].step": torch.tensor(float("nan"))})
    assert [b[0] for b in optims.compare(a, nan)[0]] == ["state[weight].step"]
    assert [b[0] for b in optims.compare(a, dict(a, **{"group0.lr": 0.2}))[0]] == ["group0.lr"]
    missing = {k: v for k, v in a.items() if k != "state[weight].step"}
    assert [b[0] for b in optims.compare(a, missing)[0]] == ["state[weight].step"]


def test_wrong_tpu_update_fails(monkeypatch):
    """A tpu-side parameter update off by 1e-3 is a failure naming the parameter; float64
    weighing does not excuse it."""
    from torch.testing._internal.common_optimizers import optim_db

    oi = next(o for o in optim_db if o.name == "SGD")
    case = optims.Case(oi, "run", "default", {}, "forloop", torch.float32)
    cpu = optims._cpu_oracle(case, 2)
    assert cpu["err"] is None
    good = optims.run_case(case, "strict", 2, cpu)
    assert good["status"] == "passed", good

    real = optims.run_optimizer

    def skewed(oi, kwargs, dev, *a, **k):
        out = real(oi, kwargs, dev, *a, **k)
        if dev == "tpu":
            out["param:bias"] = out["param:bias"] + 1e-3
        return out
    monkeypatch.setattr(optims, "run_optimizer", skewed)
    bad = optims.run_case(case, "strict", 2, cpu)
    assert bad["status"] == "failed" and "param:bias" in bad["cause"], bad

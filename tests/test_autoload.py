"""`import torch` loads torchtpu through PyTorch's `torch.backends` entry point (issue 15).

Autoload names the device without importing JAX (torchtpu_autoload.py, torchtpu/device/lazy.py);
the device's first use, whatever it is, loads torchtpu and behaves as if it had been
imported. Each first touch runs in a fresh interpreter: it must be the process's first.
"""
import os
import subprocess
import sys
import types

import pytest
import torch

PROGRAM = (
    "import sys, torch\n"
    "torch.manual_seed(0)\n"
    "x = torch.randn(2, 3, device='tpu')\n"
    "print(x.device, 'torchtpu' in sys.modules)\n"
    "print(torch.equal((x * 2).cpu(), x.cpu() * 2))\n"
)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    e = dict(os.environ, JAX_PLATFORMS="cpu")
    e.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # on unless the test turns it off
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


# What needs no kernel works at once, without loading torchtpu or JAX: the device name, the
# accelerator, a device generator, torch.manual_seed (kept for the device generator).
BEFORE_FIRST_OP = (
    "import sys, torch\n"
    "assert torch.device('tpu').type == 'tpu' and not torch.ones(1).is_tpu\n"
    "assert torch.accelerator.current_accelerator().type == 'tpu'\n"
    "assert torch.Generator(device='tpu').device.type == 'tpu'\n"
    "assert 'torchtpu' in str(type(torch.tpu))\n"
    "torch.manual_seed(0)\n"
    "print(sorted(m for m in ('jax', 'jaxlib', 'torchtpu') if m in sys.modules))\n"
)


def test_import_torch_autoloads_the_tpu_device():
    r = _run(BEFORE_FIRST_OP + PROGRAM)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["[]", "tpu:0", "True", "True"]


def test_torch_tpu_submodules_import_before_torchtpu_loads():
    # `from torch.cuda.amp import autocast` with cuda changed to tpu, under autoload alone:
    # the import loads torchtpu, whose torch.tpu registers its submodules
    r = _run("import sys, torch\n"
             "from torch.tpu.amp import GradScaler, autocast\n"
             "import torch.tpu.memory\n"
             "print(torch.tpu.memory is sys.modules['torch.tpu.memory'], torch.tpu.amp.autocast is autocast)\n"
             "try:\n    import torch.tpu.nothing\nexcept ImportError:\n    print('missing')\n")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True", "missing"]


def test_autoload_can_be_disabled_like_any_backend():
    r = _run(PROGRAM, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode != 0
    assert "RuntimeError" in r.stderr and "tpu" in r.stderr
    assert "torchtpu" not in r.stdout


def test_import_torchtpu_after_autoload_replaces_the_lazy_binding():
    import torchtpu
    from torchtpu.device import lazy, module

    assert torch.tpu is module and sys.modules["torch.tpu"] is module
    assert type(torch.tpu) is types.ModuleType
    assert not lazy._libs and not lazy._patches  # no lazy kernel left to shadow torchtpu's
    assert torch.Event.__module__ == "torchtpu.device.events" and torch.from_dlpack.__module__.startswith("torchtpu")


# Each program runs right after `import torch` (autoload on) in a fresh interpreter, with
# torchtpu and JAX not yet imported; CPU PyTorch computes the expected values beside it.
FIRST_TOUCHES = {
    "randn": """
torch.manual_seed(0)
x = torch.randn(2, 3, device="tpu")
assert x.device.type == "tpu" and torch.equal((x * 2).cpu(), x.cpu() * 2)
""",
    "to": """
a = torch.arange(6.).reshape(2, 3)
b = a.to("tpu")
assert b.device.type == "tpu" and torch.equal(b.cpu(), a)
c = torch.ones(2, requires_grad=True).tpu()
assert c.is_tpu and c.requires_grad
""",
    "is_available": """
assert torch.tpu.is_available() is True and torch.tpu.device_count() == 1
assert "jax" in sys.modules and type(torch.tpu).__name__ == "module"
""",
    "generator": """
g = torch.Generator(device="tpu")
assert g.device.type == "tpu" and "jax" not in sys.modules
g.manual_seed(3); a = torch.rand(4, device="tpu", generator=g)
g.manual_seed(3); b = torch.rand(4, device="tpu", generator=g)
assert torch.equal(a.cpu(), b.cpu()) and g.get_offset() == 1
""",
    "autocast": """
with torch.autocast("tpu", dtype=torch.bfloat16):
    y = torch.ones(2, 2, device="tpu") @ torch.ones(2, 2, device="tpu")
with torch.autocast("cpu", dtype=torch.bfloat16):
    yc = torch.ones(2, 2) @ torch.ones(2, 2)
assert y.dtype == yc.dtype and torch.equal(y.cpu(), yc)
""",
    "load_map_location": """
import io
buf = io.BytesIO(); torch.save({"w": torch.arange(4.)}, buf); buf.seek(0)
sd = torch.load(buf, map_location="tpu")
assert sd["w"].device.type == "tpu" and torch.equal(sd["w"].cpu(), torch.arange(4.))
""",
    "load_saved_on_tpu": """
sd = torch.load(PATH)
assert sd["w"].device.type == "tpu" and torch.equal(sd["w"].cpu(), torch.arange(5.))
""",
    "compile": """
fn = lambda x: x.sin() + 1
f = torch.compile(fn, backend="tpu")
x = torch.randn(5)
assert torch.allclose(f(x.to("tpu")).cpu(), fn(x), atol=1e-6)
""",
    "accelerator": """
assert torch.accelerator.current_accelerator().type == "tpu" and "jax" not in sys.modules
torch.accelerator.synchronize()
assert torch.accelerator.memory_allocated() == 0
""",
    "event": """
s = torch.Event(device="tpu", enable_timing=True)
e = torch.Event(device="tpu", enable_timing=True)
s.record(); x = torch.ones(3, device="tpu") + 1; e.record(); e.synchronize()
assert e.query() and isinstance(e, torch.Event) and s.elapsed_time(e) >= 0
assert torch.Event(device="cpu").device.type == "cpu"
""",
    "stream": """
st = torch.Stream(device="tpu")
assert st.device.type == "tpu" and isinstance(st, torch.Stream)
x = torch.ones(3).to("tpu", non_blocking=True); st.synchronize(); assert st.query()
""",
    "pin_memory": """
p = torch.arange(4.).pin_memory()
assert p.is_pinned() and torch.equal(p, torch.arange(4.))
assert torch.empty(3, pin_memory=True).is_pinned() and not torch.ones(2).is_pinned()
""",
    "storage": """
s = torch.UntypedStorage(4, device="tpu")
assert s.device.type == "tpu" and s.nbytes() == 4
assert torch.UntypedStorage(3).device.type == "cpu"
del s
""",
    "module_to_keeps_ties": """
from torch import nn
emb = nn.Embedding(4, 3); head = nn.Linear(3, 4, bias=False); head.weight = emb.weight
cpu = nn.Sequential(emb, head)
m = cpu.to("tpu")
assert m[0].weight is m[1].weight and m[0].weight.device.type == "tpu"
cpu64 = nn.Sequential(nn.Embedding(4, 3), nn.Linear(3, 4, bias=False)); cpu64[1].weight = cpu64[0].weight
assert cpu64.to(torch.float64)[0].weight is cpu64[1].weight
""",
    "from_dlpack": """
import numpy as np
t = torch.from_dlpack(np.arange(3.0), device="tpu")
assert t.device.type == "tpu" and torch.equal(t.cpu(), torch.arange(3.0, dtype=torch.float64))
""",
    "init_process_group": """
import os, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=PORT, RANK="0", WORLD_SIZE="1")
dist.init_process_group(backend="tpu")
t = torch.arange(4., device="tpu"); dist.all_reduce(t)
assert torch.equal(t.cpu(), torch.arange(4.))
dist.destroy_process_group()
""",
    "manual_seed_before_load": """
torch.manual_seed(0)
assert "jax" not in sys.modules
a = torch.randn(3, device="tpu")
import torchtpu
torch.manual_seed(0)
assert torch.equal(torch.randn(3, device="tpu").cpu(), a.cpu())
""",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIRST_TOUCHES))
def test_first_touch_loads_torchtpu(name, tmp_path):
    path = tmp_path / "saved_on_tpu.pt"
    if name == "load_saved_on_tpu":
        import torchtpu  # noqa: F401  (this process writes the checkpoint on tpu)

        torch.save({"w": torch.arange(5.).to("tpu")}, path)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _run("import sys, torch\n"
             "assert 'jax' not in sys.modules and 'torchtpu' not in sys.modules\n"
             f"PATH, PORT = {str(path)!r}, {str(port)!r}\n"
             + FIRST_TOUCHES[name] + "print('ok')\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok"], r.stdout + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.mark.slow
def test_import_torchtpu_without_autoload_binds_everything():
    r = _run("import sys, torch, torchtpu\n"
             "assert type(torch.tpu).__name__ == 'module' and torch.tpu.device_count() == 1\n"
             "assert 'torchtpu.device.lazy' in sys.modules\n"
             "torch.manual_seed(0); x = torch.randn(3, device='tpu')\n"
             "print(x.device)\n", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["tpu:0"]


TRAINER = """
import sys, torch
assert "jax" not in sys.modules
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
import transformers
transformers.logging.set_verbosity_error()
cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                 max_position_embeddings=32, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
torch.manual_seed(0)
BertForSequenceClassification(cfg).save_pretrained(OUT + "/model")
g = torch.Generator().manual_seed(0)
x, y = torch.randint(0, 64, (40, 12), generator=g), torch.randint(0, 2, (40,), generator=g)
data = [{"input_ids": x[i], "labels": y[i]} for i in range(40)]

def train(sub, **kw):
    args = TrainingArguments(output_dir=OUT + sub, max_steps=5, seed=0, report_to=[], logging_steps=1,
                             disable_tqdm=True, **kw)
    t = Trainer(model=BertForSequenceClassification.from_pretrained(OUT + "/model"), args=args, train_dataset=data)
    t.train()
    return [h["loss"] for h in t.state.log_history if "loss" in h], t

losses, t = train("/tpu")  # default arguments, torchtpu never imported: the device is chosen for us
assert t.args.device.type == "tpu" and {p.device.type for p in t.model.parameters()} == {"tpu"}
cpu_losses, c = train("/cpu", use_cpu=True)
assert c.accelerator.device.type == "cpu" and len(losses) == len(cpu_losses) == 5
torch.testing.assert_close(losses, cpu_losses, atol=1e-5, rtol=1e-4)
"""


@pytest.mark.slow
def test_default_trainer_trains_on_tpu_with_autoload_alone(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    r = _run(f"OUT = {str(tmp_path)!r}\n" + TRAINER + "print('ok')\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-1:] == ["ok"], r.stdout[-2000:]

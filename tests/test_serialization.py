"""torch.save / torch.load, pickling, safetensors and storage pointers of tpu tensors.

Each test runs one program on CPU and on tpu (in strict and defer_and_fuse eager
modes) and compares what comes back: values, dtype, device, strides, storage
sharing and exception classes. CPU PyTorch is the oracle; a tpu tensor loaded with
map_location=None comes back on tpu, as a CUDA tensor comes back on CUDA.
"""
from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import assert_same, assert_values

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]


@pytest.fixture(params=["strict", "defer_and_fuse"])
def mode(request):
    with torchtpu.eager_mode(request.param):
        yield request.param


def _sample(dtype, shape=(3, 4)):
    g = torch.Generator().manual_seed(1)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def _expected_device(saved_on: str, map_location) -> str:
    if map_location is None:
        return saved_on
    return torch.device(map_location).type


EXACT = dict(rtol=0, atol=0, check_stride=True)  # what a load gives back: every bit, strides too


def _with_offsets(x):
    """Each tensor of `x` with its storage offset (a loaded view keeps CPU's), to be compared."""
    return torch.utils._pytree.tree_map(
        lambda t: (t, t.storage_offset()) if isinstance(t, torch.Tensor) else t, x)


def _program(device, dtype):
    """A tensor computed on `device` (pending in defer_and_fuse), a view of it, a copy."""
    x = _sample(dtype).to(device)
    y = x.flip(0) if dtype == torch.bool else x.flip(0) * 1
    return {"x": x, "y": y, "row": y[1], "colT": y.t()[1:], "list": [x, 3]}


@pytest.mark.parametrize("dtype,map_location", [(d, None) for d in DTYPES] + [
    (d, m) for d in (torch.float32, torch.bfloat16, torch.bool, torch.int64) for m in ("cpu", "tpu")], ids=str)
def test_save_load_every_dtype(mode, dtype, map_location):
    on_cpu = _roundtrip(_program("cpu", dtype))
    on_tpu = _roundtrip(_program("tpu", dtype), map_location=map_location)
    device = _expected_device("tpu", map_location)
    if device == "tpu":
        assert_same(_with_offsets(on_tpu), _with_offsets(on_cpu), **EXACT)
    else:  # loaded onto the CPU
        assert all(t.device.type == "cpu" for t in torch.utils._pytree.tree_leaves(on_tpu)
                   if isinstance(t, torch.Tensor))
        assert_values(_with_offsets(on_tpu), _with_offsets(on_cpu), **EXACT)
    assert on_tpu["list"][1] == 3


def test_cpu_checkpoint_loads_onto_tpu(mode):
    x = torch.arange(6.0).reshape(2, 3)
    got = _roundtrip({"x": x, "v": x[1]}, map_location="tpu")
    assert_same(_with_offsets(got), _with_offsets({"x": x, "v": x[1]}), **EXACT)
    got = _roundtrip({"x": x}, map_location=torch.device("tpu", 0))
    assert_same(_with_offsets(got), _with_offsets({"x": x}), **EXACT)
    got = _roundtrip({"x": x}, map_location={"cpu": "tpu"})
    assert_same(_with_offsets(got), _with_offsets({"x": x}), **EXACT)


def test_views_share_storage_after_load(mode):
    def run(device):
        base = torch.arange(24.0).reshape(4, 6).to(device) + 1
        views = {"base": base, "row": base[2], "t": base.t(), "strided": base[:, 1::2], "flat": base.view(-1)}
        got = _roundtrip(views)
        same = [got[k].untyped_storage().data_ptr() == got["base"].untyped_storage().data_ptr() for k in views]
        got["strided"].mul_(-1)  # a write through a view reaches the base, as before saving
        got["row"].fill_(7)
        return got, same

    cpu, cpu_same = run("cpu")
    tpu, tpu_same = run("tpu")
    assert tpu_same == cpu_same == [True] * 5
    assert_same(_with_offsets(tpu), _with_offsets(cpu), **EXACT)


def test_dtype_views_of_one_storage_rejected_as_on_cpu(mode):
    def run(device):
        x = torch.ones(4, device=device)
        with pytest.raises(RuntimeError) as err:
            torch.save([x, x.view(torch.int32)], io.BytesIO())
        return str(err.value)

    assert run("tpu") == run("cpu")


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _steps(model, opt, n, device, start=0):
    losses = []
    for i in range(start, start + n):
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(5, 8, generator=g).to(device), torch.randint(0, 3, (5,), generator=g).to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_state_dict_and_adamw_state_roundtrip(mode):
    results = {}
    for device in ("cpu", "tpu"):
        model = _mlp().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _steps(model, opt, 2, device)
        ckpt = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
        for v in ckpt["model"].values():
            assert v.device.type == device
        for st in ckpt["opt"]["state"].values():
            assert st["exp_avg"].device.type == device
            assert st["step"].device.type == "cpu"  # AdamW keeps its step count on the host
        model2 = _mlp().to(device)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        model2.load_state_dict(ckpt["model"])
        opt2.load_state_dict(ckpt["opt"])
        results[device] = (_steps(model2, opt2, 2, device, start=2), model2.state_dict())
    assert_same(results["tpu"], results["cpu"], rtol=1e-4, atol=1e-5)  # the losses, then the weights


def test_pickle_and_deepcopy(mode):
    shared = {}
    for device in ("cpu", "tpu"):
        x = torch.arange(6.0, device=device).reshape(2, 3) * 2
        pair = pickle.loads(pickle.dumps([x, x[1]]))
        assert pair[0].device.type == device
        shared[device] = pair[0].untyped_storage().data_ptr() == pair[1].untyped_storage().data_ptr()
        assert pair[1].device.type == device
        assert_values(pair[1], torch.tensor([6.0, 8.0, 10.0]))
        model = _mlp().to(device)
        clone = copy.deepcopy(model)
        assert clone[0].weight.device.type == device
        assert clone[0].weight.data_ptr() != model[0].weight.data_ptr()
        assert_values(clone[0].weight, model[0].weight)  # a copy on the same device
    assert shared["tpu"] == shared["cpu"]  # pickle keeps sharing only within one storage, alike


def test_data_ptr_and_nbytes(mode):
    def run(device):
        x = torch.arange(12.0, device=device).reshape(3, 4) + 0
        y = x + 1
        itemsize = x.element_size()
        return [
            x.data_ptr() != 0,
            x.data_ptr() != y.data_ptr(),
            x[1].data_ptr() == x.data_ptr() + x.stride(0) * itemsize,
            x[:, 2].data_ptr() == x.data_ptr() + 2 * itemsize,
            x.view(-1).data_ptr() == x.data_ptr(),
            x.t().data_ptr() == x.data_ptr(),
            x.clone().data_ptr() != x.data_ptr(),
            x.untyped_storage().data_ptr() == x[2].untyped_storage().data_ptr(),
            x.untyped_storage().data_ptr() == x.data_ptr(),
            x.untyped_storage().nbytes(),
            y.untyped_storage().nbytes(),
            x[1:].untyped_storage().nbytes(),
            torch.empty(0, device=device).data_ptr(),
            torch.empty(5, dtype=torch.int16, device=device).untyped_storage().nbytes(),
        ]

    assert run("tpu") == run("cpu")
    # tpu addresses never collide with live CPU memory or with each other
    a = torch.zeros(100, device="tpu")
    b = torch.zeros(100, device="tpu")
    c = torch.zeros(100)
    spans = sorted((t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()) for t in (a, b, c))
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))


def test_untyped_storage_methods(mode):
    def run(device):
        x = torch.arange(4, dtype=torch.int32, device=device) * 3
        st = x.untyped_storage()
        assert st.device.type == device and st.clone().device.type == device
        out = [st.nbytes(), st.cpu().tolist(), st.clone().cpu().tolist()]
        fresh = torch.UntypedStorage(16, device=device)
        fresh.copy_(st)
        out.append(torch.empty(0, dtype=torch.int32, device=device).set_(fresh).cpu().tolist())
        with pytest.raises(RuntimeError) as err:
            torch.UntypedStorage(3, device=device).copy_(st)
        out.append(str(err.value))
        out.append(torch.UntypedStorage([1, 2, 3], device=device).cpu().tolist())
        return out

    assert run("tpu") == run("cpu")
    moved = torch.UntypedStorage(8).tpu()
    assert moved.device.type == "tpu" and moved.nbytes() == 8


def test_untyped_storage_items(mode):
    # storage[i], storage[i] = v, storage[a:b] = v, fill_, len(), tolist() and printing, as on
    # CPU and CUDA (they read a byte count of 0 or failed on the device buffer)
    def run(device):
        x = torch.arange(4.0, device=device) * 3
        st = x.untyped_storage()
        out = [len(st), st[0], st[7], st[-1], st.tolist()]
        st[0] = 5
        st[1:3] = 7
        out.append(x.cpu().view(torch.uint8).tolist())
        with pytest.raises(IndexError) as err:
            st[16]
        out.append(str(err.value))
        fresh = torch.UntypedStorage(6, device=device)
        out.append(fresh.fill_(3).tolist())
        out.append(str(torch.UntypedStorage([1, 2, 3], device=device)).splitlines()[:3])
        out.append(list(torch.UntypedStorage([4, 5], device=device)))
        return out

    assert run("tpu") == run("cpu")
    with pytest.raises(NotImplementedError, match="slice of a tpu storage"):
        torch.arange(4.0, device="tpu").untyped_storage()[2:6]


def test_safetensors_roundtrip(mode, tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    results = {}
    for device in ("cpu", "tpu"):
        model = _mlp().to(device)
        sd = {k: v * 1 for k, v in model.state_dict().items()}
        sd["bf16"] = torch.arange(6.0, device=device).to(torch.bfloat16)
        sd["view"] = sd["bf16"][2:]  # a view: safetensors rejects shared memory alike
        with pytest.raises(RuntimeError) as err:
            safetensors_torch.save_file(sd, str(tmp_path / f"shared_{device}.safetensors"))
        del sd["view"]
        path = str(tmp_path / f"{device}.safetensors")
        safetensors_torch.save_file(sd, path)
        # safetensors' Rust side knows a fixed list of device names ("tpu" is not one):
        # files load on the host and move, as transformers does
        loaded = {k: v.to(device) for k, v in safetensors_torch.load_file(path).items()}
        # save_model dedupes tied weights by pointer, the way it does on CUDA
        tied = _mlp().to(device)
        tied[2].weight = torch.nn.Parameter(tied[2].weight[:, :16])
        tied.register_parameter("alias", tied[2].weight)
        mpath = str(tmp_path / f"model_{device}.safetensors")
        safetensors_torch.save_model(tied, mpath)
        fresh = _mlp().to(device)
        fresh.register_parameter("alias", fresh[2].weight)
        missing, unexpected = safetensors_torch.load_model(fresh, mpath)
        results[device] = (type(err.value), {k: v for k, v in loaded.items()}, sorted(missing), sorted(unexpected),
                           fresh.alias.data_ptr() == fresh[2].weight.data_ptr(), fresh[2].weight.detach())
    cpu, tpu = results["cpu"], results["tpu"]
    assert tpu[0] is cpu[0]
    assert tpu[1].keys() == cpu[1].keys()
    assert_same(_with_offsets(tpu[1]), _with_offsets(cpu[1]), **EXACT)
    assert tpu[2:5] == cpu[2:5]
    assert_same(tpu[5], cpu[5])


def test_distributed_checkpoint_single_process(mode, tmp_path):
    import torch.distributed.checkpoint as dcp

    results = {}
    for device in ("cpu", "tpu"):
        model = _mlp().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _steps(model, opt, 2, device)
        path = str(tmp_path / device)
        dcp.save({"model": model.state_dict(), "opt": opt.state_dict()}, checkpoint_id=path)
        model2 = _mlp().to(device)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        _steps(model2, opt2, 1, device, start=50)  # create optimizer state to load into
        state = {"model": model2.state_dict(), "opt": opt2.state_dict()}
        dcp.load(state, checkpoint_id=path)
        model2.load_state_dict(state["model"])
        opt2.load_state_dict(state["opt"])
        assert next(model2.parameters()).device.type == device
        results[device] = _steps(model2, opt2, 2, device, start=2)
    assert_values(results["tpu"], results["cpu"], rtol=1e-4, atol=1e-5)  # losses read from each device


_RESUME = r"""
import sys, torch, torchtpu
sys.path.insert(0, sys.argv[1])
from test_serialization import _mlp, _steps
for mode, path in zip(sys.argv[2::2], sys.argv[3::2]):
    with torchtpu.eager_mode(mode):
        ckpt = torch.load(path)
        assert ckpt["model"]["0.weight"].device.type == "tpu"
        model = _mlp().to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        print("LOSSES", mode, _steps(model, opt, 5, "tpu", start=5))
"""


def test_checkpoint_resumes_in_fresh_process(tmp_path):
    """Acceptance: a tpu run saves model+AdamW state after 5 steps; a fresh process loads it
    on tpu and runs 5 more; its losses equal an uninterrupted 10-step run (in strict and
    defer_and_fuse; one fresh process resumes both)."""
    cpu_model = _mlp()
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    cpu_losses = _steps(cpu_model, cpu_opt, 10, "cpu")
    args, runs = [], {}
    # The fresh process reads the executables this one compiles from a persistent cache:
    # the test is about state, not compile time.
    import jax

    cache = str(tmp_path / "xla_cache")
    previous = jax.config.jax_compilation_cache_dir
    torchtpu.compile_cache_dir(cache)
    try:
        for mode in ("strict", "defer_and_fuse"):
            with torchtpu.eager_mode(mode):
                model = _mlp().to("tpu")
                opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
                first = _steps(model, opt, 5, "tpu")
                path = str(tmp_path / f"ckpt_{mode}.pt")
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
                runs[mode] = (first, _steps(model, opt, 5, "tpu", start=5))
                args += [mode, path]
    finally:
        torchtpu.compile_cache_dir(previous)

    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", _RESUME, here, *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu", TORCHTPU_CACHE_DIR=cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = {}
    for line in proc.stdout.splitlines():
        if line.startswith("LOSSES "):
            _, mode, losses = line.split(" ", 2)
            resumed[mode] = eval(losses)
    for mode, (first, rest) in runs.items():
        assert resumed[mode] == rest, mode  # the same programs on the same device: bit for bit
        assert_values(first + resumed[mode], cpu_losses, rtol=1e-4, atol=1e-5)

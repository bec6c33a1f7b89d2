"""torchtpu.jax_op: JAX functions and Pallas kernels as torch ops, in every execution path,
checked against the same math written as PyTorch ops on CPU."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from conftest import assert_same, atol_by_scale, check_against
from torchtpu.eager import deferred

_ids = itertools.count()


def _name(base):
    """A fresh op name per registration: a name can be registered once per process."""
    return f"jaxop_test::{base}_{next(_ids)}"


def _swiglu(x, w):
    a, b = jnp.split(x @ w, 2, axis=-1)
    return jax.nn.silu(a) * b


def _swiglu_torch(x, w):
    a, b = (x @ w).chunk(2, -1)
    return F.silu(a) * b


SWIGLU = torchtpu.jax_op("jaxop_test::swiglu", _swiglu)


def _inputs():
    return torch.randn(4, 8), torch.randn(8, 6)


# float32 1e-5 relative, measured against the tensor's scale (sums of products cancel)
TOL = dict(rtol=1e-5, atol=atol_by_scale(1e-5))


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_forward_and_gradients_match_pytorch(mode, no_fallback):
    torchtpu.reset_metrics()
    with torchtpu.eager_mode(mode):
        check_against(SWIGLU, _swiglu_torch, *_inputs(), grad=True, **TOL)
        check_against(torch.ops.jaxop_test.swiglu, _swiglu_torch, *_inputs(), grad=True, **TOL)
    assert torchtpu.metrics()["cpu_fallbacks"] == 0


def test_strict_compiles_once_per_signature():
    x, w = (t.to("tpu") for t in _inputs())
    with torchtpu.eager_mode("strict"):
        SWIGLU(x, w)
        torch.tpu.synchronize()
        torchtpu.reset_metrics()
        for _ in range(3):
            SWIGLU(x, w)
        torch.tpu.synchronize()
    m = torchtpu.metrics()
    assert m["compiles"] == 0 and m["cache_hits"] == 3


def test_defer_and_fuse_region_with_the_op_is_one_executable(no_fallback):
    x, w = _inputs()
    with torchtpu.eager_mode("defer_and_fuse"):
        xt, wt = x.to("tpu"), w.to("tpu")
        torch.tpu.synchronize()
        torchtpu.reset_metrics()
        y = (SWIGLU(xt * 2, wt) + 1).relu().sum(0)
        assert deferred.pending_count() >= 4  # recorded, not run
        y.cpu()  # runs the region
    m = torchtpu.metrics()
    assert m["regions_executed"] == 1 and m["region_compiles"] == 1 and m["executions"] == 1
    assert_same(y, (_swiglu_torch(x * 2, w) + 1).relu().sum(0), rtol=1e-5, atol=1e-5)


def test_torch_compile_fullgraph_inlines_the_op(no_fallback):
    torch._dynamo.reset()
    seen = []

    def f(x, w):
        return SWIGLU(x * 2, w) * 0.5 + 1

    def ref(x, w):
        return _swiglu_torch(x * 2, w) * 0.5 + 1

    from torch._dynamo.backends.registry import lookup_backend

    tpu_backend = lookup_backend("tpu")

    def spy(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return tpu_backend(gm, example_inputs)

    torchtpu.reset_metrics()
    check_against(torch.compile(f, backend="tpu", fullgraph=True), ref, *_inputs(), grad=True, **TOL)
    torch._dynamo.reset()
    torch.compile(f, backend=spy, fullgraph=True)(*(t.to("tpu") for t in _inputs()))
    assert any("jaxop_test.swiglu" in s for s in seen)
    m = torchtpu.metrics()
    assert m["cpu_fallbacks"] == 0 and m["compile_graphs"] >= 2  # forward and backward programs


def test_opcheck_passes():
    """PyTorch's opcheck, its default test utils. test_autograd_registration refuses every
    device but CPU/CUDA/XPU (NotImplementedError in PyTorch), so on tpu tensors it runs the
    other defaults; on CPU tensors (the same op through JAX on the host) that one."""
    from torch.library import opcheck
    from torch.testing._internal.optests.generate_tests import DEFAULT_TEST_UTILS

    on_tpu = [u for u in DEFAULT_TEST_UTILS if u != "test_autograd_registration"]
    x, w = (t.to("tpu").requires_grad_() for t in _inputs())
    opcheck(SWIGLU, (x, w), test_utils=on_tpu)
    opcheck(SWIGLU, tuple(t.requires_grad_() for t in _inputs()), test_utils="test_autograd_registration")


def test_static_arguments_tuple_output_and_integer_output_without_gradient():
    name = _name("norm_argmax")

    @torchtpu.jax_op(name)
    def norm_argmax(x: jax.Array, eps: float = 1e-6, axes: tuple[int, ...] = (-1,)) -> tuple[jax.Array, jax.Array]:
        y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=axes, keepdims=True) + eps)
        return y, jnp.argmax(x, axis=-1)

    x = torch.randn(3, 5)
    xt = x.to("tpu").requires_grad_()
    y, idx = norm_argmax(xt, eps=1e-5)
    ref = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5)
    assert_same(y, ref, rtol=1e-5, atol=1e-5)
    assert idx.dtype == torch.int64 and not idx.requires_grad
    assert torch.equal(idx.cpu(), x.argmax(-1))
    y.sum().backward()
    xc = x.clone().requires_grad_()
    (xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + 1e-5)).sum().backward()
    assert_same(xt.grad, xc.grad, rtol=1e-5, atol=1e-5)
    # compiled: the statics stay Python values (a tuple default included), the op is inlined
    y2 = torch.compile(lambda x: norm_argmax(x, eps=1e-5)[0] * 2, backend="tpu", fullgraph=True)(xt.detach())
    assert_same(y2, ref * 2, rtol=1e-5, atol=1e-5)
    # the same op on CPU tensors runs the same function through JAX on the host
    yc, ic = norm_argmax(x, eps=1e-5)
    assert_same(yc, ref, rtol=1e-5, atol=1e-5, device="cpu")


def test_tensor_list_and_optional_arguments():
    name = _name("weighted_sum")

    def weighted_sum(xs: list[jax.Array], scale: jax.Array | None = None) -> jax.Array:
        out = sum(xs)
        return out if scale is None else out * scale

    op = torchtpu.jax_op(name, weighted_sum)
    a, b, s = torch.randn(3), torch.randn(3), torch.randn(3)
    at, bt, st = (t.to("tpu").requires_grad_() for t in (a, b, s))
    assert_same(op([at, bt]), a + b)
    y = op([at, bt], st)
    assert_same(y, (a + b) * s)
    y.sum().backward()
    assert_same([at.grad, st.grad], [s, a + b])


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_wrong_shape_or_dtype_raises_naming_the_op_at_the_call(mode):
    def lax_add(x, y):
        return jax.lax.add(x, y)  # lax wants equal dtypes and shapes

    name = _name("lax_add")
    op = torchtpu.jax_op(name, lax_add)
    with torchtpu.eager_mode(mode):
        with pytest.raises(RuntimeError, match=r"(?s)jaxop_test::swiglu.*\(4, 8\).*\(5, 6\)"):
            SWIGLU(torch.randn(4, 8).to("tpu"), torch.randn(5, 6).to("tpu"))
        with pytest.raises(RuntimeError, match=rf"(?s){name}.*float32.*float64"):
            op(torch.randn(3).to("tpu"), torch.randn(3, dtype=torch.float64).to("tpu"))
        with pytest.raises(RuntimeError, match=__file__.replace(".", r"\.")):
            op(torch.randn(3).to("tpu"), torch.randn(4).to("tpu"))


def test_registration_errors():
    with pytest.raises(RuntimeError, match="already registered"):
        torchtpu.jax_op("jaxop_test::swiglu", _swiglu)
    with pytest.raises(TypeError, match="not jittable"):
        torchtpu.jax_op(_name("numpy"), lambda x: jnp.asarray(np.asarray(x) + 1))
    with pytest.raises(TypeError, match="not jittable"):
        torchtpu.jax_op(_name("branch"), lambda x: x if x.sum() > 0 else -x)
    with pytest.raises(TypeError, match="not callable"):
        torchtpu.jax_op(_name("nothing"), 3)
    with pytest.raises(TypeError, match=r"\*args"):
        torchtpu.jax_op(_name("varargs"), lambda *xs: xs[0])
    with pytest.raises(ValueError, match="namespace::op"):
        torchtpu.jax_op("no_namespace", _swiglu)


def test_late_lowering_reaches_the_eager_dispatcher(no_fallback):
    """A @lower registered after import serves its op at once (it used to reach only
    torch.compile, while eager calls took the CPU fallback)."""
    from torchtpu.ops import registry

    name = _name("late")
    torch.library.define(name, "(Tensor x) -> Tensor")
    registry.lower(name, variants=False)(lambda x: x * 3 + 1)
    ns, op = name.split("::")
    x = torch.randn(5)
    assert_same(getattr(getattr(torch.ops, ns), op)(x.to("tpu")), x * 3 + 1)


# --- Pallas -------------------------------------------------------------------------------


def _pallas_matmul(a, b):
    from jax.experimental import pallas as pl

    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32))(a, b)


@jax.custom_vjp
def _pallas_linear(x, w):
    return _pallas_matmul(x, w.T)


def _pallas_linear_fwd(x, w):
    return _pallas_linear(x, w), (x, w)


def _pallas_linear_bwd(res, g):
    x, w = res
    return _pallas_matmul(g, w), _pallas_matmul(g.T, x)  # Pallas kernels in backward too


_pallas_linear.defvjp(_pallas_linear_fwd, _pallas_linear_bwd)
PALLAS_LINEAR = torchtpu.jax_op("jaxop_test::pallas_linear", _pallas_linear)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_pallas_kernel_with_custom_vjp_trains_like_the_pytorch_layer(mode, no_fallback):
    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 3, bias=False)
    w = torch.nn.Parameter(ref.weight.detach().to("tpu"))
    xs = [torch.randn(8, 6) for _ in range(20)]
    target = torch.randn(3, 6)
    ys = [x @ target.T for x in xs]
    opt = torch.optim.SGD([w], lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    losses, losses_ref = [], []
    with torchtpu.eager_mode(mode):
        for x, y in zip(xs, ys):
            loss = F.mse_loss(PALLAS_LINEAR(x.to("tpu"), w), y.to("tpu"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            loss_ref = F.mse_loss(ref(x), y)
            opt_ref.zero_grad()
            loss_ref.backward()
            opt_ref.step()
            losses_ref.append(loss_ref.item())
    np.testing.assert_allclose(losses, losses_ref, rtol=1e-5)
    assert losses[-1] < losses[0]


# --- interop with JAX ---------------------------------------------------------------------


def test_to_jax_and_from_jax_share_device_buffers():
    from torchtpu.runtime import storage

    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    a = torchtpu.to_jax(t)
    assert isinstance(a, jax.Array) and a.shape == (3, 4) and a.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(a), x.numpy())
    np.testing.assert_array_equal(np.asarray(torchtpu.to_jax(t.t()[1:])), x.t()[1:].numpy())  # a view
    flat = jnp.arange(6, dtype=jnp.int32) * 2
    u = torchtpu.from_jax(flat)
    assert u.device.type == "tpu" and u.dtype == torch.int32 and storage.lookup(u).buf is flat  # no copy
    assert torchtpu.to_jax(u) is flat
    b = torchtpu.from_jax(jnp.ones((2, 3), jnp.bfloat16))
    assert b.shape == (2, 3) and b.dtype == torch.bfloat16
    b.add_(1)  # the tensor's writes never reach the (immutable) JAX array
    assert torch.equal(b.cpu(), torch.full((2, 3), 2.0, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="tpu tensor"):
        torchtpu.to_jax(x)


def test_dlpack_both_ways():
    x = torch.randn(3, 4)
    t = x.to("tpu")
    a = jax.dlpack.from_dlpack(t.t())  # a tpu tensor exports its JAX array
    np.testing.assert_array_equal(np.asarray(a), x.t().numpy())
    back = torch.from_dlpack(jnp.arange(4.0), device="tpu")
    assert back.device.type == "tpu"
    assert_same(back, torch.arange(4.0, dtype=torch.float64))
    # elsewhere PyTorch's own path: a CPU tensor, and a host JAX array stays host memory here
    assert torch.from_dlpack(torch.arange(3)).device.type == "cpu"
    if torchtpu.platform() == "cpu":
        assert torch.from_dlpack(jnp.arange(3.0)).device.type == "cpu"


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_dlpack_capsules_and_tpu_producers(mode):
    """to_dlpack(tpu tensor) is its JAX buffer's capsule (PyTorch's C++ exporter gave a null
    pointer); from_dlpack of a tpu tensor shares its storage as CUDA's does; a raw capsule reaches
    device="tpu"; a tensor made from a C++ exporter's capsule names DLPack, not a bare KeyError."""
    from torch.utils.dlpack import to_dlpack

    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    with torchtpu.eager_mode(mode):
        t = x.to("tpu") * 2
        cap = to_dlpack(t)
        back = torch.from_dlpack(cap)  # the capsule describes where JAX holds the buffer
        assert torch.equal(back.cpu(), x * 2)
        if torchtpu.platform() == "cpu":  # host memory on XLA:CPU
            assert back.device.type == "cpu"
        onto = torch.asarray(to_dlpack(t), device="tpu")
        assert onto.device.type == "tpu" and torch.equal(onto.cpu(), x * 2)
        assert torch.equal(torch.from_dlpack(to_dlpack(x), device="tpu").cpu(), x)
        same = torch.from_dlpack(t)
        assert same.device == t.device
        same.add_(1)  # an alias, as torch.from_dlpack of a CUDA tensor is
        assert torch.equal(t.cpu(), x * 2 + 1)
        copied = torch.from_dlpack(t, copy=True)
        copied.add_(1)
        assert torch.equal(t.cpu(), x * 2 + 1)
        assert t.__dlpack_device__() == torchtpu.to_jax(t).__dlpack_device__()
        bad = torch._C._from_dlpack(torch._C._to_dlpack(t))
        with pytest.raises(RuntimeError, match="no device buffer.*DLPack"):
            (bad + 1).cpu()


# --- the README's examples -------------------------------------------------------------------


def _readme_examples():
    import os
    import re

    text = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    section = text.split("## Custom kernels", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_custom_kernel_examples_run_as_written(no_fallback, capsys):
    examples = _readme_examples()
    assert len(examples) == 3
    for code in examples:
        if "tokamax" in code:
            pytest.importorskip("tokamax", reason="tokamax is not installed (pip install torchtpu[kernels])")
        exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert float(printed[-1]) < 1e-4  # Tokamax attention vs F.scaled_dot_product_attention


# --- SPMD programs: DDP with the op inside fused regions and compiled graphs ------------------


@pytest.mark.slow  # two processes, about a minute on 2 cores
def test_ddp_with_the_op_in_fused_regions_and_compiled_programs():
    """Two ranks train a layer holding a jax_op under DDP in defer_and_fuse, where a step is
    one SPMD program with the all-reduce inside, matching one CPU process on the whole batch;
    and a compiled function all-reduces the op's output inside its one SPMD program."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    import multiproc

    procs = multiproc.launch(os.path.abspath(__file__), "ddp", timeout=240)
    res = [multiproc.result(p) for p in procs]
    for r in res:
        assert r["fallbacks"] == {}
        assert r["fused_regions"] > 0  # the DDP steps ran as regions with their all-reduces
    mean = [sum(x) / len(x) for x in zip(*(r["defer_and_fuse"] for r in res))]
    np.testing.assert_allclose(mean, res[0]["ref"], rtol=1e-5)
    for r in res:
        np.testing.assert_allclose(r["compiled"], r["compiled_ref"], rtol=1e-5, atol=1e-5)
        assert r["compiled_collectives"] > 0


def _ddp_worker() -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()

    class Block(torch.nn.Module):
        def __init__(self, swiglu):
            super().__init__()
            self.inp = torch.nn.Linear(8, 8)
            self.w = torch.nn.Parameter(torch.randn(8, 12) / 3)
            self.out = torch.nn.Linear(6, 1)
            self.swiglu = swiglu

        def forward(self, x):
            return self.out(self.swiglu(self.inp(x), self.w))

    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4 * world, 8, generator=g), torch.randn(4 * world, 1, generator=g)) for _ in range(4)]

    def train(model, device, shard):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        step = model
        losses = []
        for x, y in data:
            if shard:
                x, y = x[rank * 4:(rank + 1) * 4], y[rank * 4:(rank + 1) * 4]
            loss = F.mse_loss(step(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return [v.item() for v in losses]

    out = {}
    torch.manual_seed(0)
    ref = Block(_swiglu_torch)
    state = ref.state_dict()
    torchtpu.reset_metrics()
    model = Block(SWIGLU)
    model.load_state_dict(state)
    with torchtpu.eager_mode("defer_and_fuse"):
        out["defer_and_fuse"] = train(DDP(model.to("tpu")), "tpu", True)
    out["fused_regions"] = torchtpu.metrics().get("regions_with_collectives", 0)
    out["ref"] = train(ref, "cpu", False)

    import torch.distributed._functional_collectives as funcol

    xs = [torch.randn(4, 8, generator=g) for _ in range(world)]
    w = torch.randn(8, 12, generator=g)
    compiled = torch.compile(lambda x, w: funcol.all_reduce(SWIGLU(x, w) * 2, "sum", dist.group.WORLD),
                             backend="tpu", fullgraph=True)
    torchtpu.reset_metrics()
    out["compiled"] = compiled(xs[rank].to("tpu"), w.to("tpu")).cpu().tolist()
    out["compiled_ref"] = sum(_swiglu_torch(x, w) * 2 for x in xs).tolist()
    m = torchtpu.metrics()
    # one graph, the all-reduce inside, run as an SPMD program
    out["compiled_collectives"] = m.get("in_graph_collective_graphs", 0) * m.get("spmd_executions", 0)
    out["fallbacks"] = m["fallback_ops"]
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    import json
    import sys

    if sys.argv[1] == "ddp":
        print("RESULT " + json.dumps(_ddp_worker()), flush=True)

"""Every reduce op NCCL accepts, in every collective that takes one, on every path.

SUM, AVG, PRODUCT, MIN, MAX and PREMUL_SUM (`dist._make_nccl_premul_sum(factor)`, a
Python number or a one-element tpu tensor: FSDP2's gradient divide factor), through
all_reduce, reduce, reduce_scatter (list), reduce_scatter_tensor, all_reduce_coalesced
and the functional collectives, in strict eager, in defer_and_fuse regions and in
compiled graphs (in-graph and skinny), with FSDP2 under `set_gradient_divide_factor`.
Oracles: plain arithmetic on the CPU from every rank's known inputs, and for FSDP2 a
single-process CPU run. One 2-process job (run as torchrun would, this file as the script
in each rank) holds the fast cases; the dtype sweep is marked slow.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import traceback

import multiproc
import pytest
import torch
import torch.distributed as dist

HERE = os.path.abspath(__file__)
R = dist.ReduceOp


def _launch(scenario: str):
    # the limit only guards against a hang: a loaded machine slows the job, it does not fail it
    return [multiproc.result(p) for p in multiproc.launch(HERE, scenario, timeout=900.0)]


@pytest.fixture(scope="module")
def job():
    return _launch("main")


def _bad(section: dict) -> dict:
    return {k: v for k, v in section.items() if v != "ok"}


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_every_reduce_op_in_every_eager_collective(job, mode):
    for r in job:
        assert not _bad(r[mode]), _bad(r[mode])
        assert len(r[mode]) >= 50, sorted(r[mode])


def test_collectives_with_premul_sum_join_fused_regions(job):
    # defer_and_fuse: all_reduce and reduce_scatter_tensor with PREMUL_SUM are recorded
    # into the region (its factor a runtime input), not run on their own
    for r in job:
        n = r["premul_fused_regions"]
        assert isinstance(n, int) and n >= 2, n


@pytest.mark.parametrize("collectives", ["in_graph", "skinny"])
def test_every_reduce_op_in_compiled_graphs(job, collectives):
    for r in job:
        got = r["compiled_" + collectives]
        assert not _bad(got), _bad(got)
        assert len(got) >= 12, sorted(got)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compiled"])
def test_fsdp2_gradient_divide_factor_matches_cpu(job, mode):
    # set_gradient_divide_factor(3) on 2 ranks: FSDP2 reduce-scatters with
    # PREMUL_SUM(1/3) (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)
    for r in job:
        res = r["fsdp_" + mode]
        assert "error" not in res, res["error"]
        assert res["ops"] == ["PREMUL_SUM"], res["ops"]
        assert res["grad_max_rel"] < 1e-5, res
        assert res["param_max_rel"] < 1e-5, res


@pytest.mark.slow
def test_reduce_ops_dtype_sweep():
    for r in _launch("sweep"):
        for mode in ("strict", "defer_and_fuse"):
            assert not _bad(r[mode]), _bad(r[mode])
            assert len(r[mode]) >= 100, len(r[mode])


# ----------------------------------------------------------------------------- in each rank

DEV = "tpu"


def _check(name, fn, results):
    try:
        fn()
        results[name] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the parent test
        results[name] = f"{type(e).__name__}: {e}"[:600]


def _eq(t, expect):
    """conftest.assert_same, exactly, against `expect` (a list, or _expect's tensor in a wider
    dtype) cast to the result's dtype, as the collective's reduction casts."""
    from conftest import assert_same

    assert_same(t, torch.as_tensor(expect).to(t.dtype), rtol=0, atol=0)


def _inputs(world: int, dtype: torch.dtype, n: int = 4):
    """Each rank's (world * n) values: small, exact in every float dtype, nonzero (for
    PRODUCT), of both signs for signed types (AVG's rounding), bools of both values."""
    out = []
    for r in range(world):
        v = torch.arange(world * n, dtype=torch.float64) % 5 + 1 + 3 * r
        if dtype.is_floating_point or dtype.is_complex or dtype in (torch.int32, torch.int64, torch.int8):
            v = v * torch.tensor([1.0, -1.0]).repeat(world * n // 2)
        if dtype == torch.bool:
            v = (torch.arange(world * n) + r) % 3 == 0
        if dtype.is_complex:
            v = torch.complex(v, v.flip(0))
        out.append(v.to(dtype))
    return out


def _expect(kind: str, stacked: torch.Tensor, factors, world: int) -> torch.Tensor:
    """The CPU oracle: every rank's inputs (stacked on dim 0) reduced as NCCL reduces them."""
    dt = stacked.dtype
    if kind == "premul_sum":
        # each rank's input times its factor cast to the dtype, the products summed in it
        prods = [stacked[r] * torch.tensor(factors[r], dtype=torch.float64).to(dt) for r in range(world)]
        out = prods[0]
        for p in prods[1:]:
            out = out + p
        return out
    if dt == torch.bool:
        return {"sum": stacked.any(0), "max": stacked.any(0), "min": stacked.all(0),
                "product": stacked.all(0)}[kind]
    if kind == "sum":
        return stacked.sum(0, dtype=dt)
    if kind == "avg":
        s = stacked.sum(0, dtype=dt)
        if dt.is_floating_point or dt.is_complex:
            return (s.to(torch.complex128 if dt.is_complex else torch.float64) / world).to(dt)
        return torch.div(s, world, rounding_mode="trunc")  # NCCL rounds toward zero
    if kind == "product":
        return stacked.prod(0, dtype=dt)
    if kind == "max":
        return stacked.amax(0)
    if kind == "min":
        return stacked.amin(0)
    fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[kind]
    out = stacked[0]
    for x in stacked[1:]:
        out = fn(out, x)
    return out


_OPS = {"sum": R.SUM, "avg": R.AVG, "product": R.PRODUCT, "min": R.MIN, "max": R.MAX,
        "band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}


def _reduce_op(kind: str, rank: int, tensor_factor: bool, factors):
    if kind != "premul_sum":
        return _OPS[kind]
    f = factors[rank]
    # as PyTorch makes it: a Python number, or a 0-dim tensor on the device
    return dist._make_nccl_premul_sum(torch.tensor(f, device=DEV) if tensor_factor else f)


def _eager_cases(rank: int, world: int, res: dict, kinds, dtypes, fused: bool) -> None:
    """Every collective with a reduce op, for each (kind, dtype); `res` gets name -> 'ok'."""
    for dtype in dtypes:
        ins = _inputs(world, dtype)
        stacked = torch.stack(ins)
        n = ins[0].numel() // world
        for kind in kinds:
            variants = [(kind, False)] + ([("premul_sum_tensor", True)] if kind == "premul_sum" else [])
            for label, tensor_factor in variants:
                # per-rank factors (NCCL premultiplies with each rank's own); bf16/fp16
                # factors that are not exact there (1/3) show the cast to the dtype
                factors = [1 / 3, 0.25] if label == "premul_sum" else [0.5, 2.0]
                want = _expect(kind, stacked, factors, world)
                tag = f"{label}:{str(dtype).removeprefix('torch.')}"

                def mine():
                    # in defer_and_fuse the input is a promise, so the collective joins its region
                    x = ins[rank].to(DEV)
                    return x * 1 if fused and dtype != torch.bool else x

                def op():
                    return _reduce_op(kind, rank, tensor_factor, factors)

                def all_reduce():
                    x = mine()
                    dist.all_reduce(x, op=op())
                    _eq(x, want)

                def all_reduce_view():
                    # a strided view: only its elements change
                    full = torch.stack([mine(), mine()], 1)
                    col = full[:, 1]
                    dist.all_reduce(col, op=op())
                    _eq(full, torch.stack([ins[rank], want], 1))

                def reduce():
                    # every collective of a case is issued before any check: a rank whose
                    # check fails must not skip a collective its peer then waits in
                    got = []
                    for dst in range(world):
                        x = mine()
                        dist.reduce(x, dst=dst, op=op())
                        got.append((x, want if rank == dst else ins[rank]))
                    for x, e in got:
                        _eq(x, e)

                def reduce_scatter_tensor():
                    out = torch.empty(n, dtype=dtype, device=DEV)
                    dist.reduce_scatter_tensor(out, mine(), op=op())
                    _eq(out, want.chunk(world)[rank])

                def reduce_scatter_list():
                    out = torch.empty(n, dtype=dtype, device=DEV)
                    dist.reduce_scatter(out, list(mine().chunk(world)), op=op())
                    _eq(out, want.chunk(world)[rank])

                def all_reduce_coalesced():
                    a, b = mine(), mine()[:3].clone()
                    dist.all_reduce_coalesced([a, b], op=op())
                    _eq(a, want)
                    _eq(b, want[:3])

                def reduce_scatter_tensor_coalesced():
                    from torch.distributed.distributed_c10d import _coalescing_manager

                    outs = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(2)]
                    with _coalescing_manager(device=torch.device(DEV)):
                        for o in outs:
                            dist.reduce_scatter_tensor(o, mine(), op=op())
                    for o in outs:
                        _eq(o, want.chunk(world)[rank])

                cases = [all_reduce, all_reduce_view, reduce, reduce_scatter_tensor, reduce_scatter_list,
                         all_reduce_coalesced, reduce_scatter_tensor_coalesced]
                if label in ("sum", "avg", "product", "min", "max", "band", "bor", "bxor"):
                    import torch.distributed._functional_collectives as funcol

                    def functional():
                        # what DTensor and FSDP2 issue: _c10d_functional ops, run eagerly
                        # (in defer_and_fuse: recorded into the region)
                        w = dist.group.WORLD
                        x = funcol.all_reduce(mine(), label, w)
                        y = funcol.reduce_scatter_tensor(mine(), label, 0, w)
                        a, b = funcol.all_reduce_coalesced([mine(), mine()[:2].clone()], label, w)
                        for g, e in ((x, want), (y, want.chunk(world)[rank]), (a, want), (b, want[:2])):
                            _eq(g, e)

                    cases.append(functional)
                for case in cases:
                    _check(f"{case.__name__}:{tag}", case, res)


def _error_cases(rank: int, world: int, res: dict) -> None:
    """Combinations NCCL refuses: a clear error naming the collective and the reduce op,
    raised on every rank before anything runs (no rank is left waiting)."""

    def raises(exc, words, fn):
        def check():
            try:
                fn()
            except exc as e:
                for w in words:
                    assert w in str(e), (w, str(e))
                return
            raise AssertionError(f"no {exc.__name__}")
        return check

    def int_premul():
        dist.all_reduce(torch.ones(4, dtype=torch.int64, device=DEV), op=dist._make_nccl_premul_sum(2.0))

    def int_premul_rs():
        dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.int32, device=DEV),
                                   torch.ones(4, dtype=torch.int32, device=DEV), op=dist._make_nccl_premul_sum(2.0))

    def bool_avg():
        dist.all_reduce(torch.ones(4, dtype=torch.bool, device=DEV), op=R.AVG)

    def float_band():
        dist.all_reduce(torch.ones(4, device=DEV), op=R.BAND)

    def empty_int_premul():
        dist.all_reduce(torch.ones(0, dtype=torch.int64, device=DEV), op=dist._make_nccl_premul_sum(2.0))

    def functional_float_bxor():
        import torch.distributed._functional_collectives as funcol

        funcol.all_reduce(torch.ones(4, device=DEV), "bxor", dist.group.WORLD).cpu()

    _check("error:premul_sum_int64", raises(TypeError, ["all_reduce", "PREMUL_SUM", "int64"], int_premul), res)
    _check("error:premul_sum_int32_reduce_scatter",
           raises(TypeError, ["reduce_scatter_tensor", "PREMUL_SUM", "int32"], int_premul_rs), res)
    _check("error:avg_bool", raises(TypeError, ["all_reduce", "AVG", "boolean"], bool_avg), res)
    _check("error:band_float", raises(TypeError, ["all_reduce", "BAND", "float32"], float_band), res)
    _check("error:premul_sum_empty_int64", raises(TypeError, ["PREMUL_SUM"], empty_int_premul), res)
    _check("error:functional_bxor_float",
           raises(Exception, ["all_reduce", "BXOR", "float32"], functional_float_bxor), res)
    # and the group still works after them (nothing was half-launched)
    _check("after_errors", lambda: _eq(_allreduced(torch.ones(2, device=DEV)), [float(world)] * 2), res)


def _allreduced(x):
    dist.all_reduce(x)
    return x


FAST_KINDS = ("sum", "avg", "product", "min", "max", "premul_sum")


def _eager(rank: int, world: int, mode: str, sweep: bool = False) -> dict:
    import torchtpu

    res: dict = {}
    with torchtpu.eager_mode(mode):
        fused = mode == "defer_and_fuse"
        if sweep:
            for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
                _eager_cases(rank, world, res, FAST_KINDS, [dt], fused)
            for dt in (torch.int64, torch.int32, torch.uint8):
                _eager_cases(rank, world, res, ("sum", "avg", "product", "min", "max", "band", "bor", "bxor"),
                             [dt], fused)
            _eager_cases(rank, world, res, ("sum", "product", "min", "max"), [torch.bool], fused)
        else:
            _eager_cases(rank, world, res, FAST_KINDS, [torch.float32], fused)
            _eager_cases(rank, world, res, ("premul_sum",), [torch.bfloat16], fused)
            _eager_cases(rank, world, res, ("avg",), [torch.int64], fused)
            _eager_cases(rank, world, res, ("band", "bxor"), [torch.int32], fused)
            _eager_cases(rank, world, res, ("sum", "min"), [torch.bool], fused)
        _error_cases(rank, world, res)
    return res


def _premul_fused_regions(rank: int, world: int) -> int:
    """Regions with collectives run by an all_reduce and a reduce_scatter_tensor with
    PREMUL_SUM in defer_and_fuse (each read back on the host, so each its own region)."""
    import torchtpu

    torchtpu.reset_metrics()
    with torchtpu.eager_mode("defer_and_fuse"):
        x = torch.ones(4, device=DEV) * (rank + 1)
        dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
        x.cpu()  # read back: this region ends
        out = torch.empty(2, device=DEV)
        y = torch.ones(2 * world, device=DEV) * (rank + 1)
        dist.reduce_scatter_tensor(out, y, op=dist._make_nccl_premul_sum(torch.tensor(0.25, device=DEV)))
        out.cpu()
    _eq(x, [0.5 * sum(range(1, world + 1))] * 4)
    _eq(out, [0.25 * sum(range(1, world + 1))] * 2)
    return torchtpu.metrics().get("regions_with_collectives", 0)


def _compiled(rank: int, world: int, collectives: str) -> dict:
    """The functional collectives with each reduce-op string inside one compiled graph, and
    `dist.*` calls Dynamo rewrites into them (PREMUL_SUM has no functional form in
    PyTorch: Dynamo refuses it for every backend, so it never reaches a graph)."""
    import torch.distributed._functional_collectives as funcol

    import torchtpu

    torch._dynamo.reset()
    torchtpu.set_collectives(collectives)
    w = dist.group.WORLD
    kinds = ("sum", "avg", "product", "min", "max")
    res: dict = {}
    try:
        f32 = _inputs(world, torch.float32)
        i64 = _inputs(world, torch.int64)
        i32 = _inputs(world, torch.int32)

        def f(x, i, j):
            out = {}
            for k in kinds:
                out[f"all_reduce:{k}"] = funcol.all_reduce(x * 1, k, w)
                out[f"reduce_scatter_tensor:{k}"] = funcol.reduce_scatter_tensor(x + 0, k, 0, w)
            a, b = funcol.all_reduce_coalesced([x * 1, x[:2] * 1], "max", w)
            out["all_reduce_coalesced:max"], out["all_reduce_coalesced:max:b"] = a, b
            c, d = funcol.reduce_scatter_tensor_coalesced([x * 1, x + 0], "avg", [0, 0], w)
            out["reduce_scatter_tensor_coalesced:avg"], out["reduce_scatter_tensor_coalesced:avg:b"] = c, d
            out["all_reduce:avg:int64"] = funcol.all_reduce(i + 0, "avg", w)
            out["all_reduce:bxor:int32"] = funcol.all_reduce(j + 0, "bxor", w)
            z = x * 1
            dist.all_reduce(z, op=R.PRODUCT)  # Dynamo rewrites it into the functional form
            out["dist.all_reduce:product"] = z
            y = torch.empty(x.numel() // world, device=x.device)
            dist.reduce_scatter_tensor(y, x * 1, op=R.AVG)
            out["dist.reduce_scatter_tensor:avg"] = y
            return out

        got = torch.compile(f, backend="tpu")(f32[rank].to(DEV), i64[rank].to(DEV), i32[rank].to(DEV))
        st = torch.stack(f32)
        want = {}
        for k in kinds:
            e = _expect(k, st, None, world)
            want[f"all_reduce:{k}"] = e
            want[f"reduce_scatter_tensor:{k}"] = e.chunk(world)[rank]
        mx = _expect("max", st, None, world)
        want["all_reduce_coalesced:max"], want["all_reduce_coalesced:max:b"] = mx, mx[:2]
        av = _expect("avg", st, None, world).chunk(world)[rank]
        want["reduce_scatter_tensor_coalesced:avg"] = want["reduce_scatter_tensor_coalesced:avg:b"] = av
        want["all_reduce:avg:int64"] = _expect("avg", torch.stack(i64), None, world)
        want["all_reduce:bxor:int32"] = _expect("bxor", torch.stack(i32), None, world)
        want["dist.all_reduce:product"] = _expect("product", st, None, world)
        want["dist.reduce_scatter_tensor:avg"] = av
        for name, e in want.items():
            _check(name, lambda: _eq(got[name], e), res)
    except Exception:  # noqa: BLE001
        res["compile"] = traceback.format_exc()[-3000:]
    finally:
        torchtpu.set_collectives("in_graph")
    return res


def _fsdp(rank: int, world: int, mode: str) -> dict:
    """A tiny MLP under fully_shard, gradient divide factor 3 (not the world size 2): its
    sharded gradients and parameters after two SGD steps against one CPU process that
    sums the ranks' gradients and divides by 3.

    Each layer is its own FSDP unit, as TorchTitan shards blocks: in defer_and_fuse one
    region holds several units' independent all-gathers and reduce-scatters, which XLA
    ordered differently on ranks whose programs differ elsewhere until regions sequenced
    their collectives in recorded order (gloo aborted with "144 vs 68")."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import torchtpu

    factor = 3.0
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))

    ref = make()
    model = make()
    model.load_state_dict(ref.state_dict())
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(world, 6, 8, generator=g), torch.randn(world, 6, 4, generator=g)) for _ in range(2)]

    ops = []
    orig = dist.reduce_scatter_single if hasattr(dist, "reduce_scatter_single") else None

    def spy(*a, **kw):
        op = kw.get("op", R.SUM)
        ops.append(getattr(getattr(op, "op", op), "name", str(op)))
        return orig(*a, **kw)

    mesh = init_device_mesh(DEV, (world,))
    model.to(DEV)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():  # each FSDP module keeps its own factor (TorchTitan sets them all)
        if hasattr(m, "set_gradient_divide_factor"):
            m.set_gradient_divide_factor(factor)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    forward = torch.compile(model, backend="tpu") if mode == "compiled" else model
    grad_rel = 0.0
    dist.reduce_scatter_single = spy
    try:
        with torchtpu.eager_mode("strict" if mode == "compiled" else mode):
            for x, y in data:
                loss = torch.nn.functional.mse_loss(forward(x[rank].to(DEV)), y[rank].to(DEV))
                opt.zero_grad()
                loss.backward()
                # the CPU reference: the sum of every rank's gradient, divided by the factor
                ropt.zero_grad()
                total = sum(torch.nn.functional.mse_loss(ref(x[r]), y[r]) for r in range(world))
                (total / factor).backward()
                for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                    gp = p.grad.full_tensor().cpu()
                    grad_rel = max(grad_rel, ((gp - q.grad).abs().max() / q.grad.abs().max()).item())
                opt.step()
                ropt.step()
    finally:
        dist.reduce_scatter_single = orig
    params = {k: p.full_tensor().cpu() for k, p in model.named_parameters()}
    param_rel = max(((params[k] - q.detach()).abs().max() / q.detach().abs().max()).item()
                    for k, q in ref.named_parameters())
    return dict(ops=sorted(set(ops)), grad_max_rel=grad_rel, param_max_rel=param_rel)


def _section(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - reported to the parent test
        return dict(error=traceback.format_exc()[-4000:])


def _worker(scenario: str) -> None:
    import warnings

    import torchtpu  # noqa: F401 - registers "tpu"

    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor's deprecation

    dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = dict(rank=rank)
    if scenario == "sweep":
        for mode in ("strict", "defer_and_fuse"):
            out[mode] = _section(_eager, rank, world, mode, True)
    else:
        for mode in ("strict", "defer_and_fuse"):
            out[mode] = _section(_eager, rank, world, mode)
        out["premul_fused_regions"] = _section(_premul_fused_regions, rank, world)
        for c in ("in_graph", "skinny"):
            out["compiled_" + c] = _section(_compiled, rank, world, c)
        for mode in ("strict", "defer_and_fuse", "compiled"):
            out["fsdp_" + mode] = _section(_fsdp, rank, world, mode)
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1])

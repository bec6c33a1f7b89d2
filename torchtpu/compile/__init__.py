"""torch.compile(model, backend="tpu"): Dynamo graphs through aot_autograd to one jax.jit each.

Dynamo captures the Python; aot_autograd functionalizes it and splits forward
from backward; each ATen graph then runs as a single JAX function built from the
same lowering table as eager, jitted per input signature. Graph breaks run in
whatever eager mode is active.

Importing this package stays cheap (no Dynamo, no aot_autograd): torchtpu imports
parts of it at `import torch` time through autoload (flex attention's lowering, the
collectives table), so the heavy modules load when a graph is first compiled, and
Dynamo's skip rules for our frames are added the moment torch._dynamo is imported.
"""
from __future__ import annotations

import os
from typing import Callable

import torch

from .. import config
from ..metrics import bump

_counter = {"graphs": 0}


def _skip_our_frames() -> None:
    """Keep Dynamo out of torchtpu and JAX. After a graph break the rest of the user's
    function runs eagerly under Dynamo's frame hook, and our Python kernels run inside
    it; Dynamo would otherwise try to trace them (and the JAX calls they make)."""
    from torch._dynamo import trace_rules

    # not torchtpu as a whole: its benchmark models are user code Dynamo must trace
    for name in (*_OUR_PACKAGES, "jax", "jaxlib"):
        trace_rules.add(name)
    _skip_below_our_frames()
    from . import decomps, fake_layout

    fake_layout.install()  # before Dynamo's first trace: tpu convolutions' fake layouts as CPU's
    decomps.keep_whole()  # two loss ops whose Autograd-key decompositions differ from their kernels


_OUR_PACKAGES = ("torchtpu.eager", "torchtpu.ops", "torchtpu.runtime", "torchtpu.compile",
                  "torchtpu.device", "torchtpu.metrics")
_skipped_modules: set[str] = set()


def _skip_below_our_frames() -> None:
    """Keep Dynamo's frame hook off everything our code calls, not just our own frames.
    trace_rules skips a frame but still hands the frames it calls to Dynamo; JAX builds
    some code at run time (dataclass __init__s, file "<string>"), which no skip rule
    names, so a kernel of ours running after a graph break (torch.tensor(list,
    device="tpu") -> jax.device_put) had Dynamo trace JAX's _DeferredShardArg.__init__,
    and wrapping its numpy argument as a fake tensor inside our dispatcher kernel fails
    (fake tensors' no_dispatch AssertionError: exaone4_5_vision, chameleon). A recursive
    skip on each code object of our packages runs what they call as plain Python.
    Modules imported later are marked on the next call (backend() calls this per graph)."""
    import sys

    from torch._C._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    seen: set[int] = set()

    def mark(code) -> None:
        if id(code) in seen:
            return
        seen.add(id(code))
        set_code_exec_strategy(code, skip)
        for c in code.co_consts:  # nested functions: the kernels our factories build
            if isinstance(c, type(code)):
                mark(c)

    def functions(owner, name: str):
        seen.add(id(owner))
        for v in list(vars(owner).values()):
            if isinstance(v, (staticmethod, classmethod)):
                v = v.__func__
            elif isinstance(v, property):
                yield from (f for f in (v.fget, v.fset, v.fdel) if f is not None)
                continue
            if isinstance(v, type) and v.__module__ == name and id(v) not in seen:
                yield from functions(v, name)
            elif getattr(v, "__module__", None) == name and hasattr(v, "__code__"):
                yield v

    for name, mod in list(sys.modules.items()):
        if mod is None or name in _skipped_modules or not name.startswith(_OUR_PACKAGES):
            continue
        _skipped_modules.add(name)
        for fn in functions(mod, name):
            mark(fn.__code__)


class _OnDynamoImport:
    """A meta-path hook: run _skip_our_frames() right after torch._dynamo has loaded."""

    def find_spec(self, name, path, target=None):
        if name != "torch._dynamo":
            return None
        import importlib.util
        import sys

        sys.meta_path.remove(self)  # the real spec, from the other finders
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _skip_our_frames()

        spec.loader.exec_module = exec_module
        return spec


def _skip_our_frames_when_dynamo_loads() -> None:
    import sys

    if "torch._dynamo" in sys.modules:
        _skip_our_frames()
    elif not any(isinstance(f, _OnDynamoImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnDynamoImport())


_skip_our_frames_when_dynamo_loads()


def _compiler(label: str):
    from . import collectives
    from .runtime import CompiledGraph

    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        _counter["graphs"] += 1
        from ..eager import carried

        if carried.graph_holds(gm):
            # complex32 or a sub-byte dtype: XLA has no element type for it, the graph lowering
            # would see its carrier; the ATen graph runs op by op through the eager kernels,
            # which serve these dtypes as CPU does (eager/carried.py)
            bump("carried_dtype_graphs")
            return gm
        name = f"{label}{_counter['graphs']}"
        if collectives.collective_nodes(gm):
            collectives.bucket_all_reduces(gm)
            why = "skinny collectives requested" if collectives.get_collectives() == "skinny" \
                else collectives.why_not_in_graph(gm)
            if why is not None:
                graph = collectives.SkinnyGraph(gm, name, CompiledGraph)
                graph.reason = why
                return graph
            bump("in_graph_collective_graphs")
        return CompiledGraph(gm, name)

    return compile_graph


def backend(gm: torch.fx.GraphModule, example_inputs, **kwargs) -> Callable:
    """The Dynamo backend registered as "tpu"."""
    from functorch.compile import default_partition, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    from . import decomps

    # The default partitioner saves every activation the backward needs; min-cut recomputes
    # cheap ones to save memory. On XLA:CPU saving was faster (small GPT fwd+bwd 15.6 vs
    # 22.6 ms); TORCHTPU_PARTITIONER=min_cut trades that for memory.
    partition = (min_cut_rematerialization_partition
                 if config.read("partitioner") == "min_cut" else default_partition)

    bump("dynamo_graphs")
    _skip_below_our_frames()  # modules imported since the last graph
    inner = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=decomps.table(),
        partition_fn=partition,
        keep_inference_input_mutations=True,
    )
    return inner(gm, example_inputs, **kwargs)


def _decompositions() -> dict:
    from . import decomps

    return decomps.table()


def _program(gm: torch.fx.GraphModule):
    from .graph import Program

    return Program(gm, host_part=False)


def _install_into_eager() -> None:
    """defer_and_fuse records torch.cond/while_loop/scan as one node: it traces them into
    this package's programs through a hook (eager/ sits below compile/)."""
    from ..eager import control_flow

    control_flow.install_graph_lowering(_decompositions, _program)


_install_into_eager()


def register() -> None:
    """Make backend="tpu" known to Dynamo (also reachable through the
    torch_dynamo_backends entry point when the package is installed)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "tpu" not in _BACKENDS or _BACKENDS["tpu"] is not backend:
        _BACKENDS.pop("tpu", None)
        register_backend(name="tpu")(backend)


def dump_stablehlo(fn: Callable, *args, path: str | os.PathLike | None = None, **kwargs) -> list[str]:
    """Compile `fn` with the tpu backend, run it once on `args`, and return the
    StableHLO text of every graph compiled by that call (also written to `path`
    if given; env TORCHTPU_DUMP_STABLEHLO=dir dumps every compiled graph)."""
    from .runtime import _dumping

    sink: list = []
    _dumping.append(sink)
    try:
        compiled = torch.compile(fn, backend=backend)
        compiled(*args, **kwargs)
    finally:
        _dumping.remove(sink)
    if path is not None:
        os.makedirs(path, exist_ok=True)
        for i, (label, text) in enumerate(sink):
            with open(os.path.join(os.fspath(path), f"{i:04d}_{label}.stablehlo.mlir"), "w") as f:
                f.write(text)
    return [text for _, text in sink]

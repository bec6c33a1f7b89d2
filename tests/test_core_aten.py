"""Every op tagged `core` in PyTorch's native_functions.yaml runs natively on tpu."""
import torch

import torchtpu
from torchtpu.eager import kernels

aten = torch.ops.aten

# Core ops not in the lowering table, and how they still run natively: runtime kernels
# (views, allocation, copies, scalars) or PyTorch's composite kernel over lowered ops.
_X = lambda: torch.randn(2, 3, 4, 5, device="tpu")  # noqa: E731
OTHER_ROUTES = {
    "_local_scalar_dense": lambda: aten._local_scalar_dense(_X()[0, 0, 0, 0]),
    "_to_copy": lambda: aten._to_copy(_X(), dtype=torch.float64),
    "alias": lambda: aten.alias(_X()),
    "as_strided": lambda: aten.as_strided(_X(), (2, 2), (1, 2)),
    "diagonal": lambda: aten.diagonal(_X()),
    "empty.memory_format": lambda: aten.empty.memory_format([2], device="tpu"),
    "empty_strided": lambda: aten.empty_strided([2, 2], [2, 1], device="tpu"),
    "expand": lambda: aten.expand(_X()[:, :1], [2, 3, 4, 5]),
    "full_like": lambda: aten.full_like(_X(), 2.0),
    "permute": lambda: aten.permute(_X(), [1, 0, 2, 3]),
    "rand": lambda: aten.rand([3], device="tpu"),
    "randn": lambda: aten.randn([3], device="tpu"),
    "select.int": lambda: aten.select.int(_X(), 1, 0),
    "slice.Tensor": lambda: aten.slice.Tensor(_X(), 1, 0, 2),
    "split_with_sizes": lambda: aten.split_with_sizes(_X(), [1, 2], 1),
    "squeeze.dim": lambda: aten.squeeze.dim(_X()[:1], 0),
    "squeeze.dims": lambda: aten.squeeze.dims(_X()[:1], [0]),
    "unsqueeze": lambda: aten.unsqueeze(_X(), 0),
    "upsample_bilinear2d.vec": lambda: aten.upsample_bilinear2d.vec(_X(), [6, 10], False, None),
    "upsample_nearest2d.vec": lambda: aten.upsample_nearest2d.vec(_X(), [6, 10], None),
    "var.dim": lambda: aten.var.dim(_X(), [1]),
    "adaptive_avg_pool1d": lambda: aten.adaptive_avg_pool1d(_X()[0], [2]),
    "avg_pool1d": lambda: aten.avg_pool1d(_X()[0], [2]),
    "resize_": lambda: aten.resize_(torch.empty(3, device="tpu"), [2, 4]),
    "view": lambda: aten.view(_X(), [6, 20]),
}
# SymInt queries, not tensor kernels
SYMBOLIC = {"sym_numel", "sym_size.int", "sym_storage_offset", "sym_stride.int", "sym_is_contiguous"}


def _core_overloads():
    # every registered schema (dir(torch.ops.aten) lists only the packets touched so far)
    out = set()
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        base = schema.name[len("aten::"):]
        packet = getattr(aten, base, None)
        ov = schema.overload_name or "default"
        op = getattr(packet, ov, None) if packet is not None else None
        if op is not None and torch.Tag.core in op.tags:
            out.add(base if ov == "default" else f"{base}.{ov}")
    return sorted(out)


def test_every_core_aten_op_is_lowered_or_has_a_native_route(no_fallback):
    core = _core_overloads()
    assert len(core) > 150
    unserved = sorted(set(core) - set(kernels.SERVED) - SYMBOLIC)
    assert unserved == sorted(OTHER_ROUTES), "new core ops need a lowering (or a route listed here)"
    torchtpu.reset_metrics()
    for name, run in OTHER_ROUTES.items():
        run()
    assert torchtpu.metrics()["cpu_fallbacks"] == 0

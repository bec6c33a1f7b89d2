"""What compiled graphs, defer_and_fuse regions and the c10d process group share.

- mesh.py: the mesh axis `AXIS`, the `SpmdGroup` interface a program needs of its group
  (distributed/'s ProcessGroup implements it), `Context` (a program's group and mesh),
  `tpu_group(name)`.
- reduce.py: torch's reduce ops (ReduceOp or a functional collective's string) as kinds.
- bodies.py: the collective bodies on each rank's flat block (shard_map over AXIS).
- functional.py: `LOWERINGS`, the `_c10d_functional` ops as JAX in a SPMD program.
- program.py: `spmd(run, ctx, donate)`, a function as one SPMD program over the mesh.
- mode.py: the in_graph / skinny switch.
- region_runner.py: the Protocol of the hook deferred calls for regions with collectives.

Layer: above ops/, below eager/. Nothing here needs eager/ (pure JAX over a group seen
through `SpmdGroup`), and eager/deferred needs `spmd()` to compile a region with
collectives, so this is the lowest place every user (deferred, compile, distributed)
reaches by importing downward.
"""
from .mesh import AXIS, Context, SpmdGroup, tpu_group
from .mode import get_collectives, set_collectives
from .program import spmd

__all__ = ["AXIS", "Context", "SpmdGroup", "tpu_group", "get_collectives", "set_collectives", "spmd"]

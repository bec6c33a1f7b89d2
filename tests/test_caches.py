"""Every module-level cache is bounded and registered (runtime/cache.py), and
torchtpu.clear_caches() empties each one."""
from __future__ import annotations

import ast
import pathlib

import torch

import torchtpu
from torchtpu.eager import dynamism  # noqa: F401 - imported on first use; registers its cache
from torchtpu.runtime import cache


def test_lru_drops_the_least_recently_used():
    lru = cache.LRU(3)
    for k in "abc":
        lru[k] = k
    assert lru.get("a") == "a"  # a use: b is now the oldest
    lru["d"] = "d"
    assert list(lru) == ["c", "a", "d"]
    assert lru.get("b") is None and lru.get("b", 0) == 0
    bound = [2]
    lru = cache.LRU(lambda: bound[0])  # a limit read when storing
    lru[1] = lru[2] = lru[3] = 0
    assert list(lru) == [2, 3]
    bound[0] = 1
    lru[4] = 0
    assert list(lru) == [4]


def test_lru_set():
    s = cache.LRUSet(2)
    s.update([1, 2])
    s.add(3)
    assert 1 not in s and 2 in s and 3 in s and len(s) == 2
    s.discard(2)
    assert list(s) == [3]
    s.clear()
    assert len(s) == 0


def test_executables_bounded_per_group_and_overall_least_recently_used_first(monkeypatch):
    from torchtpu.runtime import executables

    class Exe:
        def __init__(self):
            self.used = next(executables.clock)

    cleared = []
    c = executables.Executables("test", lambda: 16, lambda: 8, lambda k: k[0], register=False)
    c.on_clear(lambda: cleared.append(1))
    for i in range(8):
        c.admit(("a", i), Exe())
    c[("a", 0)].used = next(executables.clock)  # a hit: ("a", 1) is now the least recent
    c.admit(("a", 8), Exe())  # past the group's 8: its least recent eighth (one) goes
    assert ("a", 1) not in c and ("a", 0) in c and len(c) == 8
    for i in range(8):
        c.admit(("b", i), Exe())
    c.admit(("c", 0), Exe())  # the overall bound: 17 > 16 evicts the least recent two
    assert len(c) == 15 and ("a", 2) not in c and ("a", 3) not in c and ("a", 0) in c
    c.drop(("c", 0))
    assert ("c", 0) not in c
    c.clear()
    assert len(c) == 0 and cleared == [1]
    # clearing the op executables clears the regions built over them
    monkeypatch.setattr(executables, "_graphs", executables._graphs)
    executables.regions["k"] = Exe()
    executables.ops.clear()
    assert len(executables.regions) == 0


# The caches the modules keep; a new one must be registered to be emptied by clear_caches().
EXPECTED = {
    "eager op executables", "graph programs", "eager op shapes seen", "fused regions",
    "fused signatures", "replayed signatures", "churning keys", "issuing code", "control flow executables",
    "exact scalar packs", "argument checks passed", "autocast casts", "jax_op output shapes", "dynamic lowerings",
}


def test_clear_caches_empties_every_registered_cache():
    assert EXPECTED <= set(cache.sizes())
    x = torch.arange(6, dtype=torch.int64).reshape(2, 3).to("tpu")
    with torchtpu.eager_mode("strict"):  # (whatever TORCHTPU_EAGER_MODE the suite runs under)
        (x + 3).cpu()  # an op executable, an exact integer scalar pack
        torch.nonzero(x).cpu()  # a hand-written kernel: its argument check
    with torchtpu.eager_mode("defer_and_fuse"):
        (x * 2 + 1).sum().cpu()  # a fused region, its signatures, the issuing code
        torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,)).cpu()  # a control-flow executable
    w = torch.randn(3, 3).to("tpu").requires_grad_()  # a leaf: autocast caches its cast
    with torch.autocast("tpu", dtype=torch.bfloat16):
        torch.nn.functional.linear(torch.randn(2, 3).to("tpu"), w).float().sum().cpu()  # a weight cast
    op = torchtpu.jax_op("test_caches::double", lambda a: a * 2)
    op(torch.ones(2).to("tpu")).cpu()
    op(torch.ones(2, device="meta"))  # a fake-tensor call: an output-shape evaluation
    held = {name: n for name, n in cache.sizes().items() if n}
    assert {"eager op executables", "fused regions", "fused signatures", "control flow executables",
            "exact scalar packs", "argument checks passed", "autocast casts", "jax_op output shapes"} <= set(held), held
    torchtpu.clear_caches()
    assert {name: n for name, n in cache.sizes().items() if n} == {}
    before = torchtpu.metrics()["compiles"]
    assert (x + 3).cpu().tolist() == (x.cpu() + 3).tolist()  # compiled again, same answer
    assert torchtpu.metrics()["compiles"] > before


def test_fused_signatures_are_bounded_by_the_executable_limit():
    old = torchtpu.executable_limit()
    try:
        torchtpu.set_executable_limit(total=2)
        s = cache.LRUSet(cache.limit("total"))
        s.update(range(5))
        assert list(s) == [3, 4]
    finally:
        torchtpu.set_executable_limit(**old)


# ---- the audit: every module-level container is a registered cache or named here -------------

PKG = pathlib.Path(torchtpu.__file__).parent
_CONTAINERS = {"dict", "set", "OrderedDict", "defaultdict", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet",
               "deque", "LRU", "LRUSet"}

# Module-level containers that are not caches: state of live objects, tables filled once at
# import, or sets bounded by the number of ATen ops. Keyed by name (not file), so moving one
# between modules does not break the audit: name -> where it lives and why it needs no bound.
NOT_CACHES = {
    "table": "runtime/storage.py: live storages, an entry leaves with its storage; compile/decomps.py: the "
             "decomposition table, built once",
    "_ends": "runtime/pinned.py: live pinned host blocks",
    "parked_buffers": "runtime/inflight.py: work in flight, until done",
    "_copies": "runtime/transfer.py: non-blocking device->host copies in flight, until the host waits",
    "_registry": "runtime/cache.py: this registry",
    "_graphs": "runtime/executables.py: weak, the program caches of live compiled graphs (each bounded)",
    "LOWERINGS": "ops/registry.py: the lowering table",
    "KERNELS": "ops/registry.py: the lowering table",
    "AUTOGRAD_KERNELS": "ops/registry.py: the lowering table",
    "OPS": "kernels/jax_op.py: registered custom ops",
    "_op": "kernels/tokamax.py: three op registrations, one each",
    "POLICY": "device/autocast.py: the autocast policy table",
    "_registered": "eager/kernels.py: ops registered with the dispatcher",
    "SERVED": "eager/kernels.py: ops served natively",
    "_served": "eager/runtime_kernels.py: eager/kernels.SERVED itself, handed over at registration",
    "_warned": "eager/fallback.py: ATen op names warned about once, bounded by the op count",
    "_grown": "eager/growth.py: weak, entries leave with their storages",
    "_marked": "eager/dynamism.py: weak, the dynamic dims of live storages",
    "_members": "eager/dynamism.py: live growing tensors; an entry leaves with its tensor (weakref callback)",
    "_contexts": "distributed/fused.py: one per live process group (holds its agreement state)",
    "_ops": "distributed/fused.py: one per collective kind",
    "_graph_lowering": "eager/control_flow.py: the hook compile/ installs (two entries)",
    "_skipped_modules": "compile/__init__.py: our modules whose code Dynamo skips, bounded by the package's modules",
    "_pending": "device/accelerate_support.py: names of Accelerate/Transformers modules still importing, at most five",
    "_default": "runtime/rng.py: each device's default generator, bounded by the device count",
    "_reserved_peak": "device/memory.py: each device's peak reserved bytes, bounded by the device count",
    "_ooms_before": "device/memory.py: each device's out-of-memory count at its last reset, bounded by the device count",
    "_streams": "device/streams.py: each device's one stream, bounded by the device count",
}


def _name_of(call: ast.expr) -> str:
    f = call.func if isinstance(call, ast.Call) else call
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _module_containers(tree: ast.Module):
    """(name, registered?) of each module-level container and cached function."""
    registered_fns = {a.id for node in tree.body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                      and _name_of(node.value) == "register" for a in node.value.args if isinstance(a, ast.Name)}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            v = node.value
            empty = isinstance(v, (ast.Dict, ast.Set)) and not getattr(v, "keys", getattr(v, "elts", None))
            if isinstance(v, ast.Call) and _name_of(v) == "register":
                yield from ((t.id, True) for t in targets if isinstance(t, ast.Name))
            elif empty or (isinstance(v, ast.Call) and _name_of(v) in _CONTAINERS and not v.keywords
                           and not [a for a in v.args if not isinstance(a, ast.Lambda)]):
                yield from ((t.id, False) for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if _name_of(d) in ("cache", "lru_cache"):
                    yield node.name, node.name in registered_fns


def test_every_module_level_cache_is_registered():
    unaccounted, stale = [], dict(NOT_CACHES)
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(("validate/", "bench/")):
            continue  # tools, one run per process
        for name, registered in _module_containers(ast.parse(path.read_text())):
            stale.pop(name, None)
            if name not in NOT_CACHES and not registered:
                unaccounted.append(f"{rel}: {name}")
    assert unaccounted == [], "register these caches (runtime/cache.register) or list them in NOT_CACHES"
    assert stale == {}, "entries of NOT_CACHES that no longer exist"

"""The layer contract: each package of torchtpu imports only from the layers below it.

    python -m torchtpu.validate layers [--all] [--root DIR]
    python torchtpu/validate/layers.py [--all]     # the same without importing torch or jax

Reads the sources with `ast` (nothing is imported or run): every `import` and
`from ... import`, at module level and inside functions (the lazy imports that dodge
import circles are dependencies all the same), relative and absolute. Each import of a
torchtpu module is an edge between two modules; each module belongs to a package, each
package to a layer (LAYERS). An edge to a package of a higher layer is "upward", one to
another package of the same layer "sideways": both break the contract. Known ones are in
ALLOWED (each names the file, the target module and the issue-14 item that removes it);
anything else is new and fails, and so does an ALLOWED entry that no longer matches any
import (the list only shrinks). Import cycles are the strongly connected components
(Tarjan) of the module graph; modules in cycles today are pinned in KNOWN_CYCLE_MODULES
the same way.

Conventions: `from .x import y` is an edge to module x.y when x/y.py exists, else to x.
Importing a submodule also runs its parents' __init__, but that implicit edge is not
counted (every module would then depend on torchtpu/__init__.py, which imports them all).
Imports under `if TYPE_CHECKING:` are skipped; `importlib.import_module` strings (the
bench/validate CLI registries) are not seen.
"""
from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Layers, lowest first; a package may import its own modules and any package of a lower
# layer. Names are the first component under torchtpu/ ("runtime" = torchtpu/runtime/ or
# torchtpu/runtime.py); "" is torchtpu/__init__.py itself.
#
# Where device/ sits: DESIGN.md lists it first, but in the code device/ is where
# torchtpu binds itself into PyTorch (renaming PrivateUse1, the torch.tpu module and its
# synchronize/eager-mode/memory calls, autocast kernels at AutocastPrivateUse1, the
# UntypedStorage methods, profiler hooks, routing torch.compile's default backend,
# Accelerate). Binding needs what it binds: the executors (eager), the compile backend
# and the runtime; and no lower layer imports device/ (checked: only torchtpu/__init__.py
# does). So it is the outermost adapter, above compile/distributed/kernels and below the
# torchtpu facade, like a driver's registration that sits on top of the driver.
# metrics.py (process-wide counters) and config.py (the TORCHTPU_* environment variables),
# both stdlib only, are read by every layer: they are the floor.
# compile, distributed and kernels are peers: none may import another. What compiled
# graphs, fused regions and the process group share is spmd/ (mesh axis, reduce kinds,
# collective bodies, the SPMD program wrapper). It sits below eager/, not just below
# compile/distributed: eager/deferred compiles a region with collectives through spmd(),
# and spmd/ needs nothing of eager/ (pure JAX over a group seen through a Protocol). The
# process-group side of such a region (cross-rank agreement, the watched launch) stays in
# distributed/, which installs it into deferred as a hook (set_collective_region_runner).
LAYERS: list[tuple[str, ...]] = [
    ("metrics", "config"),                     # counters; TORCHTPU_* settings (both stdlib only)
    ("runtime",),                              # storage table, transfers, geometry, JAX env
    ("ops",),                                  # ATen -> JAX lowerings and their rules
    ("spmd",),                                 # mesh axis, reduce kinds, collective bodies, spmd()
    ("eager",),                                # strict/debug/defer_and_fuse executors, fallback
    ("compile", "distributed", "kernels"),     # Dynamo backend, c10d backend, custom kernels
    ("device",),                               # binding into torch: registration, torch.tpu, autocast
    ("",),                                     # torchtpu/__init__.py: the public facade
    ("demo", "validate", "bench"),             # CLIs and tools over the public API
    ("__main__", "autoload"),                  # entry points: `python -m torchtpu`, torch's autoload
]

# Modules whose layer differs from their package's, with the reason.
MODULE_LAYERS: dict[str, tuple[str, str]] = {
    # the entry point torch's autoload calls: its one job is `import torchtpu`
    "torchtpu.device.autoload": ("autoload", "entry point: PyTorch's torch.backends autoload runs it to import torchtpu"),
}

# Today's known breaks of the contract: (importing file, imported module) -> reason.
# One entry covers every import of that module in that file. Remove an entry when the
# import goes (the test fails on a stale entry); never add one for new code without an
# issue item that will remove it.
ALLOWED: dict[tuple[str, str], str] = {
}

# Modules in import cycles today (issue 14: "no import circle"). A module joining a cycle
# fails the test; one that leaves every cycle must be removed here.
KNOWN_CYCLE_MODULES: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Edge:
    src: str      # importing module, dotted
    dst: str      # imported module, dotted
    file: str     # importing file, relative to the root's parent ("torchtpu/ops/nn.py")
    line: int
    lazy: bool    # inside a function (runs when called, not at import)


@dataclass
class Report:
    modules: dict[str, str]                       # module -> file
    edges: list[Edge]
    breaks: list[tuple[Edge, str]] = field(default_factory=list)  # (edge, "upward"/"sideways")
    cycles: list[list[str]] = field(default_factory=list)
    import_time_cycles: list[list[str]] = field(default_factory=list)  # module-level imports only
    unmapped: list[str] = field(default_factory=list)


def _module_name(path: Path, root: Path, pkg: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([pkg, *parts])


def _is_type_checking(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If):
        return False
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """(node, lazy) for every import statement run by the module or its functions; lazy when
    inside a function. Walks statement lists only (an import is a statement), and skips the
    body of `if TYPE_CHECKING:` (never run)."""
    out = []

    def visit(stmts, lazy):
        for st in stmts:
            if isinstance(st, (ast.Import, ast.ImportFrom)):
                out.append((st, lazy))
                continue
            inner = lazy or isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef))
            if not _is_type_checking(st):
                visit(getattr(st, "body", ()), inner)
            for name in ("orelse", "finalbody"):
                visit(getattr(st, name, ()), inner)
            for h in getattr(st, "handlers", ()):   # try/except
                visit(h.body, inner)
            for c in getattr(st, "cases", ()):      # match
                visit(c.body, inner)

    visit(tree.body, False)
    return out


def scan(root: Path, pkg: str | None = None) -> Report:
    """The module graph of the package at `root` (a directory with __init__.py)."""
    root = Path(root)
    pkg = pkg or root.name
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    modules = {_module_name(p, root, pkg): p for p in files}
    edges: list[Edge] = []
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        rel = str(path.relative_to(root.parent))
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, lazy in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    frm = ".".join(base + ([node.module] if node.module else []))
                else:
                    frm = node.module or ""
                for a in node.names:
                    sub = f"{frm}.{a.name}"
                    targets.append(sub if sub in modules else frm)
            for t in targets:
                if t != pkg and not t.startswith(pkg + "."):
                    continue
                # `import torchtpu.ops.registry` names a module; a dotted name past a module
                # (never written today) falls back to its longest module prefix
                while t not in modules and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t != mod:
                    edges.append(Edge(mod, t, rel, node.lineno, lazy))
    return Report({m: str(p.relative_to(root.parent)) for m, p in modules.items()}, edges)


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module: str, layers=None, module_layers=None) -> int | None:
    layers = LAYERS if layers is None else layers
    module_layers = MODULE_LAYERS if module_layers is None else module_layers
    pkg = module_layers[module][0] if module in module_layers else package_of(module)
    for i, names in enumerate(layers):
        if pkg in names:
            return i
    return None


def _group_of(module: str, module_layers) -> str:
    return module_layers[module][0] if module in module_layers else package_of(module)


def check(report: Report, layers=None, module_layers=None) -> Report:
    """Fill report.breaks, report.unmapped and report.cycles."""
    layers = LAYERS if layers is None else layers
    module_layers = MODULE_LAYERS if module_layers is None else module_layers
    report.breaks = []
    report.unmapped = sorted(m for m in report.modules if layer_of(m, layers, module_layers) is None)
    for e in report.edges:
        a, b = layer_of(e.src, layers, module_layers), layer_of(e.dst, layers, module_layers)
        if a is None or b is None:
            continue
        if b > a:
            report.breaks.append((e, "upward"))
        elif b == a and _group_of(e.src, module_layers) != _group_of(e.dst, module_layers):
            report.breaks.append((e, "sideways"))
    report.cycles = cycles(report.modules, report.edges)
    report.import_time_cycles = cycles(report.modules, [e for e in report.edges if not e.lazy])
    return report


def cycles(modules, edges) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), largest first."""
    graph: dict[str, list[str]] = {m: [] for m in modules}
    for e in edges:
        graph.setdefault(e.src, []).append(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v):  # iterative, so a deep graph never hits the recursion limit
        work = [(v, iter(graph.get(v, ())))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out, key=lambda c: (-len(c), c))


def verdict(report: Report, allowed=None, known_cycle_modules=None):
    """(new breaks, stale ALLOWED keys, modules newly in cycles, stale cycle modules)."""
    allowed = ALLOWED if allowed is None else allowed
    known = KNOWN_CYCLE_MODULES if known_cycle_modules is None else known_cycle_modules
    seen = {(e.file, e.dst) for e, _ in report.breaks}
    new = [(e, kind) for e, kind in report.breaks if (e.file, e.dst) not in allowed]
    stale = sorted(k for k in allowed if k not in seen)
    in_cycles = {m for c in report.cycles for m in c}
    return new, stale, sorted(in_cycles - known), sorted(known - in_cycles)


def render(report: Report, allowed=None, known_cycle_modules=None, show_all=False,
           cycle_edges=False) -> tuple[str, bool]:
    """The report as text and whether the contract holds (nothing new, nothing stale)."""
    allowed = ALLOWED if allowed is None else allowed
    new, stale, new_cyc, stale_cyc = verdict(report, allowed, known_cycle_modules)
    lines = []
    if report.unmapped:
        lines.append("modules in no layer (add their package to LAYERS):")
        lines += [f"  {m} ({report.modules[m]})" for m in report.unmapped]
    shown = report.breaks if show_all else new
    if shown:
        lines.append("upward/sideways imports" + ("" if show_all else " not in ALLOWED") + ":")
        for e, kind in sorted(shown, key=lambda x: (x[0].file, x[0].line)):
            tag = " (allowed)" if (e.file, e.dst) in allowed else " NEW"
            lines.append(f"  {e.file}:{e.line}: {kind} {package_of(e.src) or 'torchtpu'} -> "
                         f"{e.dst}{' [lazy]' if e.lazy else ''}{tag}")
    if stale:
        lines.append("stale ALLOWED entries (no such import any more: remove them):")
        lines += [f"  {f} -> {t}" for f, t in stale]
    if report.cycles:
        lines.append(f"{'cycle':>5}  {'modules':>7}  {'lazy edges':>10}  members")
        for i, c in enumerate(report.cycles, 1):
            cs = set(c)
            inner = [e for e in report.edges if e.src in cs and e.dst in cs]
            lazy = sum(e.lazy for e in inner)
            lines.append(f"{i:>5}  {len(c):>7}  {lazy:>4}/{len(inner):<5}  {', '.join(c)}")
            if cycle_edges:
                lines += [f"         {e.file}:{e.line} -> {e.dst}{' [lazy]' if e.lazy else ''}"
                          for e in sorted(inner, key=lambda e: (e.file, e.line, e.dst))]
    if new_cyc:
        lines.append("modules newly in an import cycle: " + ", ".join(new_cyc))
    if stale_cyc:
        lines.append("KNOWN_CYCLE_MODULES no longer in a cycle (remove them): " + ", ".join(stale_cyc))
    n_up = sum(k == "upward" for _, k in report.breaks)
    n_side = len(report.breaks) - n_up
    sizes = ",".join(str(len(c)) for c in report.cycles) or "-"
    ok = not (new or stale or new_cyc or stale_cyc or report.unmapped)
    lines.append(
        f"layers: {len(report.modules)} modules, {len(report.edges)} imports; "
        f"{n_up} upward + {n_side} sideways ({len({(e.file, e.dst) for e, _ in report.breaks})} file->module pairs, "
        f"{len(new)} not allowed, {len(stale)} stale allowed); "
        f"{len(report.cycles)} cycles (sizes {sizes}), {len(report.import_time_cycles)} without lazy imports; "
        f"{'OK' if ok else 'FAIL'}"
    )
    return "\n".join(lines), ok



# Reaching into another module: reading its private names (`storage._table`) or assigning its
# attributes (`executor.dynamic = f`) couples two modules through what neither declares. None
# stands today; one pinned here (as ALLOWED pins imports) would be allowed until removed, and a
# pinned one that is gone fails tests/test_layers.py (the list only shrinks).
KNOWN_REACH_INS: set[tuple[str, str]] = set()


def _aliases(path: Path, root: Path, tree: ast.Module) -> dict[str, str]:
    """Names a module binds to torchtpu modules (`from ..runtime import storage as st`)."""
    rel = path.relative_to(root.parent).with_suffix("")
    pkg = list(rel.parts[:-1])  # the package a relative import starts from
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                mod = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == root.name:
                mod = node.module.split(".")
            else:
                continue
            for a in node.names:
                target = root.parent.joinpath(*mod, a.name)
                if target.with_suffix(".py").exists() or (target / "__init__.py").exists():
                    found[a.asname or a.name] = ".".join(mod + [a.name])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == root.name and a.asname:
                    found[a.asname] = a.name
    return found


def reach_ins(root: Path) -> list[tuple[str, int, str, str]]:
    """(file, line, "private read" | "attribute set", module.name) for every place a module of
    `root` (tools under validate/ and bench/ aside) reads another module's private name or
    assigns another module's attribute."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("validate/", "bench/")):
            continue
        tree = ast.parse(path.read_text())
        names = _aliases(path, root, tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in names:
                        out.append((rel, node.lineno, "attribute set", f"{names[t.value.id]}.{t.attr}"))
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names \
                    and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and isinstance(node.ctx, ast.Load):
                out.append((rel, node.lineno, "private read", f"{names[node.value.id]}.{node.attr}"))
    return out


def reach_in_verdict(found, known=None) -> tuple[list, list]:
    """(reach-ins not pinned in KNOWN_REACH_INS, pinned ones no longer found)."""
    known = KNOWN_REACH_INS if known is None else known
    seen = {(f, target) for f, _, _, target in found}
    return [r for r in found if (r[0], r[3]) not in known], sorted(known - seen)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.validate layers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent), help="package directory")
    ap.add_argument("--all", action="store_true", help="list allowed breaks too, not only new ones")
    ap.add_argument("--edges", action="store_true", help="list the imports inside each cycle")
    args = ap.parse_args(argv)
    text, ok = render(check(scan(Path(args.root))), show_all=args.all, cycle_edges=args.edges)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The layer contract (torchtpu/validate/layers.py): packages import only downward.

Reads sources with `ast`; nothing is imported or run, so the test is fast and stable.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from torchtpu.validate import layers

PKG = Path(layers.__file__).resolve().parent.parent  # torchtpu/


@pytest.fixture(scope="module")
def report():
    return layers.check(layers.scan(PKG))


def test_every_module_has_a_layer(report):
    # a new package must be placed in LAYERS before it lands
    assert report.unmapped == []
    assert len(report.modules) > 50 and len(report.edges) > 200  # the scan really read the tree


def test_no_new_upward_import(report):
    new, _, _, _ = layers.verdict(report)
    assert new == [], "imports against the layer order (fix them, or see ALLOWED):\n" + "\n".join(
        f"{e.file}:{e.line} -> {e.dst} ({kind})" for e, kind in new)


def test_allow_list_has_no_stale_entry(report):
    # an entry whose import is gone must be removed: the list only shrinks
    _, stale, _, _ = layers.verdict(report)
    assert stale == []
    for (file, target), reason in layers.ALLOWED.items():
        assert (PKG.parent / file).is_file() and target.startswith("torchtpu.") and reason


def test_no_new_import_cycle(report):
    _, _, new_cyc, stale_cyc = layers.verdict(report)
    assert new_cyc == [], f"modules newly in an import cycle: {new_cyc}"
    assert stale_cyc == [], f"no longer in a cycle, remove from KNOWN_CYCLE_MODULES: {stale_cyc}"


def test_no_new_reach_into_another_module():
    # another module's private names read, or its attributes assigned (issue 31): none
    found = layers.reach_ins(PKG)
    new, stale = layers.reach_in_verdict(found)
    assert new == [], "reads of another module's private names / assignments to its attributes:\n" + "\n".join(
        f"{f}:{line}: {kind} {target}" for f, line, kind, target in new)
    assert stale == [], f"no longer found, remove from KNOWN_REACH_INS: {stale}"


def test_reach_in_scan_sees_private_reads_and_attribute_sets(tmp_path):
    # the scan on a small package: each way of naming another module, and what is not a reach-in
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "store.py").write_text("_table = {}\ntable = _table\nhook = None\n")
    (pkg / "user.py").write_text(
        "from .sub import store\n"
        "from .sub import store as st\n"
        "import pkg.sub.store as abs_st\n"
        "def f():\n"
        "    a = store._table\n"            # private read
        "    b = st._table.get(1)\n"        # through an alias
        "    c = abs_st.table\n"            # public: fine
        "    d = store.__name__\n"          # dunder: fine
        "    store.hook = f\n"              # attribute set
        "    abs_st.hook = None\n")
    found = sorted((f, line, kind, target) for f, line, kind, target in layers.reach_ins(pkg))
    assert found == [("user.py", 5, "private read", "pkg.sub.store._table"),
                     ("user.py", 6, "private read", "pkg.sub.store._table"),
                     ("user.py", 9, "attribute set", "pkg.sub.store.hook"),
                     ("user.py", 10, "attribute set", "pkg.sub.store.hook")]


def test_cli_passes_on_the_tree(capsys, monkeypatch, report):
    # the tree's scan is the fixture's (parsing it twice doubles the test's time); check()
    # starts afresh on it
    monkeypatch.setattr(layers, "scan", lambda root, pkg=None: report)
    assert layers.main(["--root", str(PKG)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("layers: ") and out.rstrip().endswith("OK")


# ---- the checker itself, on synthetic trees -------------------------------------------------

def _tree(tmp_path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, src in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(src))
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return root


LAYERS = [("runtime",), ("ops",), ("eager",), ("compile", "distributed"), ("",)]


def _check(root):
    return layers.check(layers.scan(root), layers=LAYERS, module_layers={})


def test_cli_fails_on_a_new_upward_import(tmp_path, capsys):
    # the real LAYERS and ALLOWED on a tree named torchtpu with one import they do not allow
    root = _tree(tmp_path, {"torchtpu/metrics.py": "", "torchtpu/runtime/storage.py": "from ..eager import deferred\n",
                            "torchtpu/eager/deferred.py": ""})
    assert layers.main(["--root", str(root / "torchtpu")]) == 1
    out = capsys.readouterr().out
    assert "  torchtpu/runtime/storage.py:1: upward runtime -> torchtpu.eager.deferred NEW\n" in out
    assert "1 not allowed" in out and out.rstrip().endswith("FAIL")


def test_clean_tree_passes(tmp_path):
    root = _tree(tmp_path, {
        "runtime/storage.py": "import os\n",
        "ops/nn.py": "from ..runtime import storage\nfrom . import other\n",
        "ops/other.py": "",
        "eager/executor.py": "import pkg.ops.nn\nfrom pkg.runtime.storage import x\n",
        "__init__.py": "from .eager import executor\n",
    })
    r = _check(root)
    assert r.breaks == [] and r.cycles == [] and r.unmapped == []
    text, ok = layers.render(r, allowed={}, known_cycle_modules=frozenset())
    assert ok and text.endswith("OK")


@pytest.mark.parametrize("src", [
    "from ..eager.executor import execute\n",                  # relative, module level
    "def f():\n    from ..eager import executor\n",             # relative, lazy in a function
    "def f():\n    import pkg.eager.executor as e\n",           # absolute, lazy
    "class K:\n    def m(self):\n        from pkg.eager import executor\n",  # in a method
    "try:\n    pass\nexcept ImportError:\n    from ..eager import executor\n",  # module level, in except
])
def test_upward_import_is_caught(tmp_path, src):
    root = _tree(tmp_path, {"ops/nn.py": "x = 1\n" + src, "eager/executor.py": "from ..ops import nn\n"})
    r = _check(root)
    assert [(e.file, e.line, e.dst, kind) for e, kind in r.breaks] == [
        ("pkg/ops/nn.py", 2 + src.count("\n") - 1, "pkg.eager.executor", "upward")]
    assert r.breaks[0][0].lazy == src.startswith(("def", "class"))  # module-level in try/except: not lazy
    assert r.cycles == [["pkg.eager.executor", "pkg.ops.nn"]]
    text, ok = layers.render(r, allowed={}, known_cycle_modules=frozenset())
    assert not ok and "pkg/ops/nn.py:" in text and "NEW" in text and text.endswith("FAIL")
    # allowed and the cycle known: the same tree passes
    _, ok = layers.render(r, allowed={("pkg/ops/nn.py", "pkg.eager.executor"): "why"},
                          known_cycle_modules=frozenset(r.cycles[0]))
    assert ok


def test_sideways_import_between_peers_is_caught(tmp_path):
    root = _tree(tmp_path, {"compile/a.py": "from ..distributed import b\n", "distributed/b.py": ""})
    r = _check(root)
    assert [(e.dst, kind) for e, kind in r.breaks] == [("pkg.distributed.b", "sideways")]


def test_type_checking_imports_are_skipped(tmp_path):
    root = _tree(tmp_path, {
        "ops/nn.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..eager import executor\n",
        "eager/executor.py": "",
    })
    assert _check(root).breaks == []


def test_stale_allow_entry_and_stale_cycle_fail(tmp_path):
    root = _tree(tmp_path, {"ops/nn.py": "", "eager/executor.py": "from ..ops import nn\n"})
    r = _check(root)
    new, stale, new_cyc, stale_cyc = layers.verdict(
        r, allowed={("pkg/ops/nn.py", "pkg.eager.executor"): "gone"},
        known_cycle_modules=frozenset({"pkg.ops.nn"}))
    assert new == [] and new_cyc == []
    assert stale == [("pkg/ops/nn.py", "pkg.eager.executor")] and stale_cyc == ["pkg.ops.nn"]
    text, ok = layers.render(r, allowed={("pkg/ops/nn.py", "pkg.eager.executor"): "gone"},
                             known_cycle_modules=frozenset())
    assert not ok and "stale ALLOWED" in text


def test_unmapped_package_fails(tmp_path):
    root = _tree(tmp_path, {"newpkg/m.py": ""})
    r = _check(root)
    assert r.unmapped == ["pkg.newpkg", "pkg.newpkg.m"]
    assert not layers.render(r, allowed={}, known_cycle_modules=frozenset())[1]


def test_cycles_are_strongly_connected_components(tmp_path):
    # a -> b -> c -> a is one cycle of 3; d -> a joins none; e <-> f is another of 2
    root = _tree(tmp_path, {
        "runtime/a.py": "from . import b\n", "runtime/b.py": "from . import c\n",
        "runtime/c.py": "def f():\n    from . import a\n", "runtime/d.py": "from . import a\n",
        "runtime/e.py": "from .f import g\n", "runtime/f.py": "from .e import h\n",
    })
    r = _check(root)
    assert r.cycles == [["pkg.runtime.a", "pkg.runtime.b", "pkg.runtime.c"], ["pkg.runtime.e", "pkg.runtime.f"]]
    # c's import of a is lazy: without it only e <-> f is a cycle at import time
    assert r.import_time_cycles == [["pkg.runtime.e", "pkg.runtime.f"]]
    text, _ = layers.render(r, allowed={}, known_cycle_modules=frozenset(), cycle_edges=True)
    assert "pkg/runtime/c.py:2 -> pkg.runtime.a [lazy]" in text and "2 cycles (sizes 3,2), 1 without lazy" in text

"""The package's layout: its import graph has no circle, between modules or between packages,
the layout page names it, and reading engine logs imports no model code.

The graph is read from the source (no module is imported): one node per module of
``src/specscope``, one edge per import of another specscope module, wherever it stands (at module
level, under ``TYPE_CHECKING`` or inside a function), so a lazy import cannot hide a circle.
Imports of other packages (torch, the optional extras) are no nodes of this graph. The package
graph merges each of specscope's packages (``tune``, ``analysis``, ``serving``, ...) into one node
and keeps an edge where a module of one imports a module of another: a circle there means two
packages are layered neither way round, even where no two modules import each other.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "specscope"

# Edges known to close a module circle, each with the change that removes it (none now).
KNOWN_CIRCLE_EDGES: set[tuple[str, str]] = set()

# Package circles known, each with the change that removes it (none now: measure/ reads a run's
# config through its own MeasureConfig and no longer imports run/).
KNOWN_PACKAGE_CIRCLES: list[list[str]] = []


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    """The dotted names an import statement in module ``name`` refers to."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = name.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    return [stem] + [f"{stem}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """Module -> the specscope modules it imports (a name imported from a package is an edge to
    that package unless the name is a submodule)."""
    modules = module_names()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = _imported(node, name, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom) and all(t in modules for t in targets[1:]):
                # "from pkg import sub": an edge to the submodule, not to the package
                targets = targets[1:]
            for target in targets:
                while target and target not in modules:  # a name in a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    if KNOWN_CIRCLE_EDGES:  # each entry must still be needed, or it hides the next circle
        assert circles(graph), "the known circle is gone: empty KNOWN_CIRCLE_EDGES"
    pruned = {a: {b for b in bs if (a, b) not in KNOWN_CIRCLE_EDGES} for a, bs in graph.items()}
    found = circles(pruned)
    edges = sum(len(bs) for bs in graph.values())
    print(
        f"\nimport graph: {len(graph)} modules, {edges} edges, {len(found)} circles "
        f"({len(KNOWN_CIRCLE_EDGES)} known edge(s) set aside)"
    )
    assert found == [], f"import circles: {found}"


def package_of(module: str) -> str:
    """The package a module belongs to, one level below specscope (``specscope.tune.bench`` ->
    ``specscope.tune``); a top-level module (``specscope.trees``) is a node of its own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the packages its modules import (edges within a package left out)."""
    out: dict[str, set[str]] = {package_of(m): set() for m in graph}
    for a, bs in graph.items():
        out[package_of(a)] |= {package_of(b) for b in bs} - {package_of(a)}
    return out


def test_no_package_imports_a_package_that_imports_it_back():
    found = circles(package_graph(import_graph()))
    for known in KNOWN_PACKAGE_CIRCLES:  # each entry must still be needed
        assert known in found, f"the known package circle {known} is gone: remove its entry"
    new = [c for c in found if c not in KNOWN_PACKAGE_CIRCLES]
    assert new == [], f"package circles: {new}"


def test_the_package_imports_nothing_of_lab():
    """``lab/`` (the checks of specscope itself) is not installed: no module may import it."""
    found = []
    for name, path in module_names().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets = _imported(node, name, path.name == "__init__.py")
                found += [(name, x) for x in targets if x == "lab" or x.startswith("lab.")]
    assert found == []


def test_the_package_graph_merges_modules_into_their_packages():
    graph = {
        "specscope.a.x": {"specscope.b.y"},
        "specscope.b.y": {"specscope.b.z"},
        "specscope.b.z": {"specscope.a.w"},  # no module circle, but a package one
        "specscope.a.w": set(),
        "specscope.top": {"specscope.a.x"},
    }
    assert circles(graph) == []
    assert package_graph(graph) == {
        "specscope.a": {"specscope.b"},
        "specscope.b": {"specscope.a"},
        "specscope.top": {"specscope.a"},
    }
    assert circles(package_graph(graph)) == [["specscope.a", "specscope.b"]]


def test_the_graph_reader_sees_lazy_and_relative_imports():
    code = "from . import b\ndef f():\n    from ..pkg.c import x\n"
    tree = ast.parse(code)
    names = [
        t
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for t in _imported(node, "specscope.pkg.a", False)
    ]
    assert names == ["specscope.pkg", "specscope.pkg.b", "specscope.pkg.c", "specscope.pkg.c.x"]


def readme_layout() -> list[str]:
    """The paths the layout page's block names (docs/explanation/layout.md), relative to
    src/specscope (``x.py``, ``x/``, ``x/y.py``; an entry indented under a folder belongs to it)."""
    block = (ROOT / "docs/explanation/layout.md").read_text().split("```")[1]
    paths, folder = [], ""
    for line in block.splitlines():
        m = re.match(r"( {2}| {4})(\S+(?:\.py|/))(?:\s|$)", line)
        if not m:
            continue
        if len(m.group(1)) == 2:
            folder = m.group(2) if m.group(2).endswith("/") else ""
            paths.append(m.group(2))
        else:
            paths.append(folder + m.group(2))
    return paths


def test_the_readme_layout_names_what_exists_and_every_top_level_module():
    listed = readme_layout()
    root = SRC / PACKAGE
    assert [p for p in listed if not (root / p).exists()] == []
    top = {
        p.name + ("/" if p.is_dir() else "")
        for p in root.iterdir()
        if p.name not in ("__init__.py", "__pycache__", "data", "presets")
    }
    named = {p.split("/")[0] + ("/" if "/" in p else "") for p in listed}
    assert sorted(top - named) == []


def test_reading_engine_logs_imports_no_model_code():
    """``specscope ingest`` and the gateway load each engine's log parser, never its export (the
    exports import torch through ``tune``): that is why vLLM and SGLang are packages of an
    ``export`` and an ``ingest`` module rather than one module each."""
    code = (
        "import sys, specscope.serving.ingest, specscope.serving.gateway\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"

"""The house's import rule (docs/design.md): packages form layers and imports only go down, no
module imports itself round a circle (type-only and function-local imports count: a circle is a
circle), and the rule files import emb only from emb.workflow, the package of the DAG's
decisions. Read from the source with ``ast``: nothing is imported to check it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"
# Low to high. A module may import its own package, any lower layer and the base modules; the
# base modules (plain modules of emb) import only each other.
LAYERS: list[set[str]] = [
    {"io", "cli", "progress", "threads", "classes", "rasters", "metrics", "provenance", "geo",
     "colours", "plots", "config_schema"},
    {"loading", "models", "cluster"},
    {"prep"},
    {"areas", "training"},
    {"evaluation"},
    {"report"},
    {"workflow"},
]  # fmt: skip
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


def modules() -> dict[str, Path]:
    found = {module_name(p): p for p in (SRC / "emb").rglob("*.py")}
    assert len(found) > 50, f"expected the package's modules under {SRC / 'emb'}"
    return found


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The emb modules ``path`` imports anywhere in it (a package's __init__ for a name that is
    not a module of it)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "emb"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "emb":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in known else node.module)
    return out - {"emb"}


def unit(module: str) -> str:
    """The layer unit of a module: its package under emb, or the base module's own name."""
    return module.split(".")[1]


def graph() -> dict[str, set[str]]:
    found = modules()
    return {m: imports_of(p, set(found)) - {m} for m, p in found.items()}


def test_every_package_and_base_module_has_a_layer() -> None:
    units = {unit(m) for m in modules() if m != "emb"}
    missing = sorted(units - set(RANK))
    assert not missing, f"give these a layer in tests/test_layers.py LAYERS: {missing}"


def test_imports_only_go_down() -> None:
    upward = []
    for module, targets in graph().items():
        if module == "emb":
            continue
        for target in targets:
            a, b = unit(module), unit(target)
            if a == b:
                continue
            if RANK[b] > RANK[a] or (RANK[b] == RANK[a] and RANK[a] > 0):
                upward.append(f"{module} -> {target} (layer {RANK[a]} -> {RANK[b]})")
    assert not upward, "imports that go up or sideways:\n" + "\n".join(sorted(upward))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle() -> None:
    circles = cycles(graph())
    assert not circles, f"modules that import each other round a circle: {circles}"


def test_the_cycle_finder_finds_a_circle() -> None:
    """The check itself: a three-module circle and a two-module one are found, a chain is not."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(cycles(edges)) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_rule_files_import_emb_only_from_the_workflow_package() -> None:
    rule_files = [REPO / "Snakefile", *(REPO / "workflow" / "rules").glob("*.smk")]
    assert len(rule_files) > 5
    stray = []
    for path in rule_files:
        for line in path.read_text().splitlines():
            match = re.match(r"\s*(?:from|import) (emb[\w.]*)", line)
            if match and not match.group(1).startswith("emb.workflow"):
                stray.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert not stray, "rule files import emb outside emb.workflow:\n" + "\n".join(stray)

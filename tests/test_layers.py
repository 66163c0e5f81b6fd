"""The house's import rule (docs/design.md): packages form layers and imports only go down, no
module imports itself round a circle (type-only and function-local imports count: a circle is a
circle), and the rule files import emb only from emb.workflow, the package of the DAG's
decisions. Read from the source with ``ast``: nothing is imported to check it."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"
# Low to high. A module may import its own package, any lower layer and the base modules; the
# base modules (plain modules of emb) import only each other.
LAYERS: list[set[str]] = [
    {"io", "stage_runner", "progress", "threads", "forks", "classes", "rasters", "metrics",
     "provenance", "geo", "colours", "plots", "config_schema"},
    {"loading", "models", "cluster"},
    {"prep"},
    {"areas", "training"},
    {"evaluation", "estimation"},  # estimation: the crop-area estimates (from evaluation)
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


def absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names: a relative one (``from ..report import
    x``, level 2) resolved against the importing module's package, so that an upward import
    cannot hide behind dots (ruff's TID252 refuses them too; this keeps the rule whole)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_in(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The emb modules ``source`` (of ``module``) imports anywhere in it, relative imports
    resolved (a package's __init__ for a name that is not a module of it)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "emb"}
        elif isinstance(node, ast.ImportFrom):
            target = absolute(module, is_package, node)
            if target.split(".")[0] != "emb":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    return out - {"emb"}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The emb modules the file at ``path`` imports (:func:`imports_in`)."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py", known)


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


def a_circle(edges: dict[str, set[str]]) -> list[str]:
    """One import circle (its modules, the first repeated at the end), or [] when there is none:
    the standard library's topological sort refuses a graph with a cycle and names one."""
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as err:
        return list(err.args[1])
    return []


def test_no_import_circle() -> None:
    circle = a_circle(graph())
    assert not circle, f"modules that import each other round a circle: {' -> '.join(circle)}"


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


def test_relative_imports_resolve_to_the_modules_they_name() -> None:
    """A relative import counts as the absolute one it stands for: an upward one fails
    test_imports_only_go_down as the absolute spelling would."""
    known = {"emb.io", "emb.report.summary", "emb.evaluation.evaluate", "emb.evaluation.windows"}
    source = "from ..report import summary\nfrom . import windows\nfrom .windows import f\n"
    assert imports_in(source, "emb.evaluation.evaluate", False, known) == {
        "emb.report.summary", "emb.evaluation.windows"
    }  # fmt: skip
    assert imports_in("from .. import io\n", "emb.evaluation", True, known) == {"emb.io"}

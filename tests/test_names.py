"""Names a newcomer tells apart (docs/design.md, "The house"): no two modules of emb share a
basename across packages, no two public classes share a name, and no module is named for a
package of emb. Read from the source with ``ast``: nothing is imported to check it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from conftest import REPO

SRC = REPO / "src" / "emb"
# Basenames every package may have: the package file itself.
SHARED_BASENAMES = {"__init__"}


def module_paths() -> list[Path]:
    paths = sorted(SRC.rglob("*.py"))
    assert len(paths) > 50, f"expected the package's modules under {SRC}"
    return paths


def dotted(path: Path) -> str:
    return ".".join(path.relative_to(SRC.parent).with_suffix("").parts)


def repeated(names: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: where for name, where in sorted(names.items()) if len(where) > 1}


def test_no_two_modules_share_a_basename() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in module_paths():
        if path.stem not in SHARED_BASENAMES:
            by_name[path.stem].append(dotted(path))
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    for name in packages & set(by_name):
        by_name[name].append(f"emb.{name} (a package)")
    assert not repeated(by_name), f"one name, two modules: {repeated(by_name)}"


def test_no_two_public_classes_share_a_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in module_paths():
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                by_name[node.name].append(dotted(path))
    assert not repeated(by_name), f"one name, two classes: {repeated(by_name)}"

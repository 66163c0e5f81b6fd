"""Names a newcomer tells apart (docs/design.md, "The house"): no two modules of emb share a
basename across packages, no two public classes share a name, no module is named for a
package of emb, and no two module or class names look alike (a plural, a filler word, a slip
of one or two letters apart). Read from the source with ``ast``: nothing is imported to check it."""

from __future__ import annotations

import ast
import functools
import itertools
import re
from collections import defaultdict
from pathlib import Path

import pytest
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


# Look-alikes: two names a reader takes for one, or for the singular and plural of one thing
# (issue 56). A pair differs only by
# - a plural (one word, s/es: run_config and run_configs),
# - a word that names a form of the same thing rather than another thing (FILLERS: Design,
#   DesignRecord and DesignPaths), added before or after,
# - or a slip of the pen: an edit distance of 1 for names of 6 letters or more, 2 for 10 or
#   more (area_estimates and area_estimator; below that distance 2 pairs unrelated words,
#   metrics and retries).
# Words that qualify (shard_manifest beside manifest), a failure (FootprintError beside
# Footprint) or settings (TileSpec beside Tile, LoopConfig beside Loop) name another thing and
# are not look-alikes. Modules are compared with modules and packages (basenames), classes with
# classes, private ones too (``_Design`` beside ``Design`` is one name twice): a class in its
# module (SampleDesign in sample_design) is not a pair.
FILLERS = frozenset(
    {"file", "files", "record", "records", "path", "paths", "info", "item", "items", "entry",
     "entries", "object", "base", "impl", "util", "utils", "helper", "helpers"}
)  # fmt: skip
MIN_LETTERS = {1: 6, 2: 10}  # edit distance: the shorter name's length from which it counts
# (a, b) in sorted order, a name pair that looks alike and is kept: why a reader tells them
# apart. Short on purpose: a rename is the usual answer.
ALLOWED: dict[tuple[str, str], str] = {
    ("areas", "areas_file"): "the areas file is a named input (config areas:), read by the "
    "module emb.areas.areas_file inside the package that builds the areas: a file in its package",
    ("LoopConfig", "LossConfig"): "the train: and loss: sections of a run's config, side by "
    "side in training/run_config.py and named <section>Config like the others (TrainConfig is "
    "the whole file's)",
}


@functools.cache
def words(name: str) -> tuple[str, ...]:
    """A module or class name as lower-case words (snake_case and CamelCase alike), a private
    name's leading underscore dropped (cached: each name meets every other)."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.lstrip("_"))
    return tuple(w for w in spaced.lower().split("_") if w)


@functools.cache
def spelled(name: str) -> str:
    """The name as snake_case, the form edit distances are counted on."""
    return "_".join(words(name))


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insert, delete, substitute one character), one row at a time: a
    few lines rather than a dependency."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def plural_of(a: str, b: str) -> bool:
    return a in (b + "s", b + "es") or b in (a + "s", a + "es")


def look_alike(a: str, b: str) -> str | None:
    """How two names differ when a reader would take them for one, else None."""
    wa, wb = words(a), words(b)
    if wa == wb:
        return "the same name"
    if len(wa) == len(wb):
        differing = [(x, y) for x, y in zip(wa, wb, strict=True) if x != y]
        if len(differing) == 1 and plural_of(*differing[0]):
            return "a plural"
    for short, long in ((wa, wb), (wb, wa)):
        if len(long) == len(short) + 1:
            if long[1:] == short and long[0] in FILLERS:
                return f"the word {long[0]!r} before it"
            if long[:-1] == short and long[-1] in FILLERS:
                return f"the word {long[-1]!r} after it"
    ja, jb = spelled(a), spelled(b)
    if abs(len(ja) - len(jb)) > max(MIN_LETTERS) or min(len(ja), len(jb)) < min(
        MIN_LETTERS.values()
    ):
        return None  # too far apart, or too short, for the distance to count: skip computing it
    distance = edit_distance(ja, jb)
    if distance in MIN_LETTERS and min(len(ja), len(jb)) >= MIN_LETTERS[distance]:
        return f"an edit distance of {distance}"
    return None


def look_alike_pairs(names: dict[str, list[str]]) -> dict[tuple[str, str], str]:
    """{(a, b): how they differ, where each is} over distinct names, a < b."""
    found = {}
    for a, b in itertools.combinations(sorted(names), 2):
        how = look_alike(a, b)
        if how is not None:
            found[(a, b)] = f"{how}: {a} ({', '.join(names[a])}), {b} ({', '.join(names[b])})"
    return found


@functools.cache
def module_names() -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in module_paths():
        if path.stem not in SHARED_BASENAMES:
            by_name[path.stem].append(dotted(path))
    for package in SRC.iterdir():
        if (package / "__init__.py").exists():
            by_name[package.name].append(f"emb.{package.name} (a package)")
    return by_name


@functools.cache
def class_names() -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in module_paths():
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                by_name[node.name].append(dotted(path))
    return by_name


def test_the_look_alike_rule() -> None:
    """What counts, on names of the kinds the tree has had (issue 56)."""
    assert look_alike("area_estimates", "area_estimator") == "an edit distance of 2"
    assert look_alike("run_config", "run_configs") == "a plural"
    assert look_alike("Batch", "Batches") == "a plural"
    assert look_alike("Design", "DesignRecord") == "the word 'record' after it"
    assert look_alike("Design", "_Design") == "the same name"
    assert look_alike("map_files", "map_file") == "a plural"
    assert look_alike("metrics", "retries") is None  # 7 letters: too short for distance 2
    assert look_alike("manifest", "shard_manifest") is None  # a qualifier names another thing
    assert look_alike("Tile", "TileSpec") is None
    assert look_alike("Footprint", "FootprintError") is None


@pytest.mark.parametrize("kind", ["modules", "classes"])
def test_no_two_names_look_alike(kind: str) -> None:
    names = module_names() if kind == "modules" else class_names()
    found = look_alike_pairs(names)
    unexplained = [how for pair, how in found.items() if pair not in ALLOWED]
    assert not unexplained, (
        f"{kind} a reader takes for one (rename one, or list the pair in ALLOWED of "
        "tests/test_names.py saying how a reader tells them apart):\n" + "\n".join(unexplained)
    )


def test_every_allowed_pair_is_still_a_look_alike() -> None:
    found = set(look_alike_pairs(module_names())) | set(look_alike_pairs(class_names()))
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"ALLOWED (tests/test_names.py) lists pairs no longer in the tree: {stale}"

"""Dry-run identity: does a restructure leave the workflow's jobs, commands and resources as
they were? (issue 56, item 8: the check the last restructure ran by hand, committed.)

``snakemake -n -p -F`` lists every job of four setups, the same ones the tests build: the demo
(config/config.yaml), an areas collection (two UTM zones, AEF, TESSERA and CDL tiles,
``tests/areas``), and the lumi and betzy profiles over 30 regions of tiny rasters
(``tests/cluster``). Snakemake prints the jobs in another order on each run, and the keys of a
``resources:`` line too, so a listing is compared as a multiset of job blocks (split at each
timestamp, blank line and job-stats table; ``jobid:`` lines and the header's run-specific
lines dropped: date, workflow id, and the config MD5, which hashes temporary paths; each
resources line and the job-stats rows sorted). Paths of the checkout and of the temporary
folder are written as ``<checkout>`` and ``<tmp>`` when listed, so two checkouts compare.

Each setup runs in its own temporary working directory (``-d``), with the checkout's own
``src`` first on PYTHONPATH (checked) and no bytecode written: nothing in the checkout is
touched and a running workflow's lock is never met. A git revision is exported with
``git archive`` (no worktree: nothing is written into the repository's .git).

Usage:

- ``python bench/dry_run_identity.py --before REV|CHECKOUT|LISTING [--after ...]``: lists
  both sides (the after side: this repository's working tree unless given), compares.
- ``python bench/dry_run_identity.py list [REV|CHECKOUT] --out DIR``: the listings of one side.
- ``python bench/dry_run_identity.py compare BEFORE AFTER``: two listing folders.

``--rename OLD=NEW`` (repeatable) substitutes text in the before listing first (a module that
moves); the report says how many blocks each touched. Exit 1 on any difference.
"""

from __future__ import annotations

import argparse
import difflib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "cluster"), str(REPO / "tests" / "areas")]

from areas_collection import Collection, make_collection  # noqa: E402
from conftest import venv_env  # noqa: E402
from test_profiles import cluster_env  # noqa: E402
from test_scale_dry_run import many_regions  # noqa: E402
from test_workflow_areas import areas_settings  # noqa: E402

SETUPS = ("demo", "areas", "lumi", "betzy")
META = "listing.json"
STAMP = re.compile(r"^(\s*)\[\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4}\] ?")
DROPPED = re.compile(r"^\s*(jobid: \d+|Date: .*|Workflow ID: .*|Config MD5: \w+)$")
RESOURCES = re.compile(r"^(\s*resources: )(.*)$")
COMMAND = re.compile(r"^(\s*Command: )\S*/")  # the venv's path to snakemake


@dataclass
class Inputs:
    """The setups' input data under ``root``, each built once when a setup first needs it."""

    root: Path
    regions: int

    @cached_property
    def collection(self) -> Collection:
        return make_collection(self.root / "collection")

    @cached_property
    def table(self) -> Path:
        return many_regions(self.root / "regions", self.regions)


@dataclass
class Setup:
    """One dry run: its working directory, its options after ``-n -p -F``, its environment."""

    work: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=venv_env)


def demo(checkout: Path, work: Path, inputs: Inputs) -> Setup:
    shutil.copytree(checkout / "config", work / "config")
    return Setup(work)


def areas(checkout: Path, work: Path, inputs: Inputs) -> Setup:
    for folder in ("config", ".test"):
        shutil.copytree(checkout / folder, work / folder)
    (work / "areas.yaml").write_text(yaml.safe_dump(areas_settings(inputs.collection)))
    return Setup(work, ["--configfile", ".test/config.yaml", "areas.yaml"])


def cluster(name: str) -> Callable[[Path, Path, Inputs], Setup]:
    """The profile's dry run as tests/cluster runs it (--cores 64: a dry run caps threads)."""

    def setup(checkout: Path, work: Path, inputs: Inputs) -> Setup:
        shutil.copytree(checkout / "config", work / "config")
        args = ["--profile", str(checkout / "profiles" / name), "--cores", "64",
                "--config", f"regions={inputs.table}"]  # fmt: skip
        return Setup(work, args, cluster_env(work))

    return setup


BUILDERS = {"demo": demo, "areas": areas, "lumi": cluster("lumi"), "betzy": cluster("betzy")}


def export(rev: str, dest: Path) -> Path:
    """The tracked files of ``rev`` of this repository in ``dest``."""
    done = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev],
                          capture_output=True, check=True)  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def describe(rev: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", f"{rev}^{{commit}}"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


def checkout_env(checkout: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the checkout's src first on PYTHONPATH, and a check that emb comes from it
    (the venv's editable emb would otherwise be the one imported)."""
    env = {**env, "PYTHONPATH": str(checkout / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    found = subprocess.run([sys.executable, "-c", "import emb; print(emb.__file__)"], env=env,
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if not Path(found).is_relative_to(checkout / "src"):
        raise SystemExit(f"emb imports from {found}, not from {checkout / 'src'}")
    return env


def list_setups(checkout: Path, out: Path, setups: list[str], regions: int, label: str) -> None:
    """Writes ``<setup>.stdout`` and ``<setup>.stderr`` of each setup's dry run into ``out``,
    paths written as ``<checkout>`` and ``<tmp>``, and listing.json (exit codes, seconds)."""
    checkout = checkout.resolve()
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, object] = {"checkout": label, "regions": regions, "setups": {}}
    with tempfile.TemporaryDirectory(prefix="dry_run_identity-") as tmp:
        root = Path(tmp)
        inputs = Inputs(root / "inputs", regions)
        for name in setups:
            work = root / name
            work.mkdir()
            setup = BUILDERS[name](checkout, work, inputs)
            cmd = ["snakemake", "-s", str(checkout / "Snakefile"), "-d", str(work), "-n", "-p",
                   "-F", *setup.args]  # fmt: skip
            started = time.perf_counter()
            done = subprocess.run(cmd, cwd=work, env=checkout_env(checkout, setup.env),
                                  capture_output=True, text=True, timeout=600)  # fmt: skip
            seconds = round(time.perf_counter() - started, 1)
            for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)):
                text = text.replace(str(checkout), "<checkout>").replace(str(root), "<tmp>")
                (out / f"{name}.{stream}").write_text(text)
            total = re.search(r"^total +(\d+)$", done.stdout, re.M)
            jobs = int(total.group(1)) if total else None
            meta["setups"][name] = {"returncode": done.returncode, "seconds": seconds, "jobs": jobs}
            print(f"{label} {name}: exit {done.returncode}, {jobs} jobs, {seconds} s", flush=True)
    (out / META).write_text(json.dumps(meta, indent=2) + "\n")


def normal(block: list[str]) -> str:
    """A block without its run-specific lines (and the venv's path in the header's command),
    its resources and job-stats rows sorted."""
    lines = [COMMAND.sub(r"\1", line) for line in block if not DROPPED.match(line)]
    for i, line in enumerate(lines):
        if found := RESOURCES.match(line):
            lines[i] = found.group(1) + ", ".join(sorted(found.group(2).split(", ")))
    if lines and lines[0] == "Job stats:":
        lines[3:] = sorted(lines[3:])  # after the title, the header and the rule
    return "\n".join(lines)


def blocks(text: str) -> Counter[str]:
    """The listing as a multiset of normalized blocks: split at timestamps, blank lines and
    the job-stats table (printed right below "Building DAG of jobs...")."""
    found: Counter[str] = Counter()
    block: list[str] = []
    for line in [*text.splitlines(), ""]:
        stamp = STAMP.match(line)
        if stamp or not line.strip() or line == "Job stats:":
            if any(x.strip() for x in block):
                found[normal(block)] += 1
            block = []
        if stamp:
            line = stamp.group(1) + line[stamp.end() :]
        if line.strip():
            block.append(line)
    return found


def renamed(found: Counter[str], renames: list[tuple[str, str]]) -> tuple[Counter[str], list[int]]:
    """``found`` with each substitution applied in turn; the blocks each one changed."""
    touched = []
    for old, new in renames:
        changed, count = Counter(), 0
        for block, n in found.items():
            changed[block.replace(old, new)] += n
            count += n if old in block else 0
        found = changed
        touched.append(count)
    return found, touched


def closest(block: str, others: list[str]) -> str:
    return max(others, key=lambda o: difflib.SequenceMatcher(None, block, o).ratio())


def diff(before: str, after: str) -> str:
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), "before", "after",
                                 lineterm="", n=2)  # fmt: skip
    return "\n".join(lines)


def compare_setup(name: str, before: Path, after: Path, renames: list[tuple[str, str]],
                  show: int) -> bool:  # fmt: skip
    """Prints one setup's comparison; True when the two listings are the same."""
    old, touched = renamed(blocks((before / f"{name}.stdout").read_text()), renames)
    new = blocks((after / f"{name}.stdout").read_text())
    matched = sum((old & new).values())
    only_old, only_new = old - new, new - old
    err_old = (before / f"{name}.stderr").read_text()
    for a, b in renames:
        err_old = err_old.replace(a, b)
    err_new = (after / f"{name}.stderr").read_text()
    codes = [json.loads((d / META).read_text())["setups"][name]["returncode"]
             for d in (before, after)]  # fmt: skip
    total = max(sum(old.values()), sum(new.values()))
    stderr = "equal" if err_old == err_new else "DIFFERS"
    print(f"{name}: {matched}/{total} blocks, {sum(only_old.values())} only before, "
          f"{sum(only_new.values())} only after; stderr {stderr}; exit {codes[0]} -> "
          f"{codes[1]}")  # fmt: skip
    for (a, b), count in zip(renames, touched, strict=True):
        print(f"  rename {a} -> {b}: {count} blocks")
    shown = list(only_old.elements())[:show]
    for block in shown:
        against = closest(block, list(only_new) or [""])
        print(f"  only before, against the closest block only after:\n{diff(block, against)}")
    rest = sum(only_old.values()) - len(shown)
    if not shown:
        for block in list(only_new.elements())[:show]:
            print(f"  only after:\n{block}")
    elif rest:
        print(f"  ... {rest} more only before")
    if err_old != err_new:
        print(f"  stderr:\n{diff(err_old, err_new)}")
    return not only_old and not only_new and err_old == err_new and codes[0] == codes[1]


def compare(before: Path, after: Path, renames: list[tuple[str, str]], show: int = 5) -> bool:
    """Each setup listed on both sides compared; a setup on one side only is a difference."""
    sides = [set(json.loads((d / META).read_text())["setups"]) for d in (before, after)]
    same = sides[0] == sides[1]
    if not same:
        print(f"setups only before: {sorted(sides[0] - sides[1])}, "
              f"only after: {sorted(sides[1] - sides[0])}")  # fmt: skip
    for name in [s for s in SETUPS if s in sides[0] & sides[1]]:
        same &= compare_setup(name, before, after, renames, show)
    print("IDENTICAL" if same else "DIFFERENT")
    return same


def side(spec: str, tmp: Path, setups: list[str], regions: int, name: str) -> Path:
    """A listing folder for ``spec``: a listing folder as it is, else a checkout folder or a
    git revision of this repository, listed into ``tmp``/``name``."""
    path = Path(spec)
    if (path / META).is_file():
        return path
    if (path / "Snakefile").is_file():
        checkout, label = path, str(path.resolve())
    else:
        checkout, label = export(spec, tmp / f"{name}-checkout"), describe(spec)
    list_setups(checkout, tmp / name, setups, regions, label)
    return tmp / name


def rename_pair(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old:
        raise argparse.ArgumentTypeError(f"--rename wants OLD=NEW, not {text!r}")
    return old, new


def options(parser: argparse.ArgumentParser, listing: bool, renames: bool) -> None:
    if listing:
        parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
        parser.add_argument("--regions", type=int, default=30, help="of the cluster setups")
    if renames:
        parser.add_argument("--rename", type=rename_pair, action="append", default=[],
                            metavar="OLD=NEW", help="applied to the before side")  # fmt: skip
        parser.add_argument("--show", type=int, default=5, help="differing blocks printed")


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    if argv[:1] == ["list"]:
        parser = argparse.ArgumentParser(prog="dry_run_identity.py list")
        parser.add_argument("source", nargs="?", default=str(REPO), help="checkout or git rev")
        parser.add_argument("--out", type=Path, required=True)
        options(parser, listing=True, renames=False)
        args = parser.parse_args(argv[1:])
        with tempfile.TemporaryDirectory() as tmp:
            listed = side(args.source, Path(tmp), args.setups, args.regions, "listing")
            shutil.copytree(listed, args.out, dirs_exist_ok=True)
        same = True
    elif argv[:1] == ["compare"]:
        parser = argparse.ArgumentParser(prog="dry_run_identity.py compare")
        parser.add_argument("before", type=Path)
        parser.add_argument("after", type=Path)
        options(parser, listing=False, renames=True)
        args = parser.parse_args(argv[1:])
        same = compare(args.before, args.after, args.rename, args.show)
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--before", required=True, help="git rev, checkout or listing")
        parser.add_argument("--after", default=str(REPO), help="checkout or listing")
        parser.add_argument("--keep", type=Path, help="folder to keep both listings in")
        options(parser, listing=True, renames=True)
        args = parser.parse_args(argv)
        with tempfile.TemporaryDirectory() as tmp:
            pairs = ((args.before, "before"), (args.after, "after"))
            sides = [side(spec, Path(tmp), args.setups, args.regions, name) for spec, name in pairs]
            if args.keep:
                for listed, name in zip(sides, ("before", "after"), strict=True):
                    shutil.copytree(listed, args.keep / name, dirs_exist_ok=True)
            same = compare(*sides, args.rename, args.show)
    print(f"wall time {time.perf_counter() - started:.0f} s")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

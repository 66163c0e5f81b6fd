"""bench/dry_run_identity.py (issue 56, item 8): two dry-run listings that differ only in what
Snakemake varies from run to run (job order, job ids, timestamps, the order of a resources
line's keys) compare equal; a changed command, a changed stderr or a module that moved without
its ``--rename`` is reported, with the pair of blocks that differ."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO

HEADER = """Config file config/config.yaml is extended by additional config.

SNAKEMAKE
=========
  Date: {date}
  Workflow ID: {uuid}
  Snakemake version: 9.27.1
  Working directory: <tmp>/demo
  Config MD5: {md5}

Building DAG of jobs...
Job stats:
job               count
--------------  -------
{stats}
total                 2

"""
JOBS = {
    "regions_table": """[Sun Dec  6 23:00:{s} 2026]
rule regions_table:
    input: config/regions.tsv
    output: results/regions.tsv
    jobid: {id}
    reason: Forced execution
    resources: {resources}
Shell command: None
""",
    "area_estimates": """[Sun Dec  6 23:00:{s} 2026]
rule area_estimates:
    input: results/maps/aef_deeplab/demo_a.tif
    output: results/areas/aef_deeplab.csv
    jobid: {id}
    reason: Forced execution
    wildcards: run=aef_deeplab
    resources: {resources}
Shell command: python -m emb.evaluation.area_estimates --run=aef_deeplab > logs/a.log 2>&1
""",
}
RESOURCES = ["tmpdir=/tmp", "runtime=10", "mem_mb=2000", "mem=2 GB", "mem_mib=1908"]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        return importlib.import_module("dry_run_identity")
    finally:
        sys.path.remove(str(REPO / "bench"))


def listing(folder: Path, order: list[str], seconds: str, *, edit: tuple[str, str] = ("", ""),
            stderr: str = "") -> Path:  # fmt: skip
    """A one-setup listing ("demo") of the two jobs in ``order``, run-specific lines set from
    ``seconds``, the resources' keys rotated by it; ``edit`` substituted in the text."""
    turn = int(seconds) % len(RESOURCES)
    resources = ", ".join(RESOURCES[turn:] + RESOURCES[:turn])
    stats = "\n".join(f"{rule:<20}{1:>3}" for rule in order)
    text = HEADER.format(date=f"2026-12-06 23:00:{seconds}", uuid=f"uuid-{seconds}",
                         md5=f"md5{seconds}", stats=stats)  # fmt: skip
    text += "\n".join(JOBS[rule].format(s=seconds, id=int(seconds) + i, resources=resources)
                      for i, rule in enumerate(order))  # fmt: skip
    folder.mkdir()
    (folder / "demo.stdout").write_text(text.replace(*edit))
    (folder / "demo.stderr").write_text(stderr)
    meta = {"checkout": folder.name, "setups": {"demo": {"returncode": 0, "jobs": 2}}}
    (folder / "listing.json").write_text(json.dumps(meta))
    return folder


def test_order_job_ids_and_resource_key_order_do_not_count(bench, tmp_path, capsys) -> None:
    before = listing(tmp_path / "before", ["regions_table", "area_estimates"], "01")
    after = listing(tmp_path / "after", ["area_estimates", "regions_table"], "13")

    assert bench.compare(before, after, [])
    assert "demo: 6/6 blocks, 0 only before, 0 only after; stderr equal" in capsys.readouterr().out


def test_a_changed_command_is_reported_with_the_closest_block(bench, tmp_path, capsys) -> None:
    before = listing(tmp_path / "before", ["regions_table", "area_estimates"], "01")
    after = listing(tmp_path / "after", ["area_estimates", "regions_table"], "13",
                    edit=("--run=aef_deeplab >", "--run=aef_deeplab --quiet >"))  # fmt: skip

    assert not bench.compare(before, after, [])
    out = capsys.readouterr().out
    assert "demo: 5/6 blocks, 1 only before, 1 only after; stderr equal" in out
    command = "Shell command: python -m emb.evaluation.area_estimates --run=aef_deeplab"
    assert f"-{command} >" in out and f"+{command} --quiet >" in out
    assert out.rstrip().endswith("DIFFERENT")


def test_a_moved_module_is_equal_only_with_its_rename(bench, tmp_path, capsys) -> None:
    moved = ("emb.evaluation.area_estimates", "emb.estimation.area_estimates")
    before = listing(tmp_path / "before", ["regions_table", "area_estimates"], "01",
                     stderr=f"warning from {moved[0]}\n")  # fmt: skip
    after = listing(tmp_path / "after", ["regions_table", "area_estimates"], "02", edit=moved,
                    stderr=f"warning from {moved[1]}\n")  # fmt: skip

    assert not bench.compare(before, after, [])
    assert "stderr DIFFERS" in capsys.readouterr().out
    assert bench.compare(before, after, [moved])
    out = capsys.readouterr().out
    assert "6/6 blocks" in out and "stderr equal" in out
    assert f"rename {moved[0]} -> {moved[1]}: 1 blocks" in out


def test_a_revision_is_exported_and_its_own_src_imported(bench, tmp_path) -> None:
    known = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True)
    if known.returncode:
        pytest.skip("not a git checkout")
    checkout = bench.export("HEAD", tmp_path / "head")
    assert (checkout / "Snakefile").is_file() and (checkout / "src" / "emb").is_dir()
    env = bench.checkout_env(checkout, bench.venv_env())
    assert env["PYTHONPATH"] == str(checkout / "src")


def test_two_dry_runs_of_the_demo_compare_equal(bench, tmp_path, capsys) -> None:
    """Real listings: Snakemake's order noise is filtered out (two runs, one checkout)."""
    for side in ("before", "after"):
        bench.list_setups(REPO, tmp_path / side, ["demo"], 30, side)

    assert bench.compare(tmp_path / "before", tmp_path / "after", [])
    found = json.loads((tmp_path / "after" / "listing.json").read_text())["setups"]["demo"]
    # the whole demo DAG: 40 jobs since one shards job aligns and cuts each (source, region)
    assert found["returncode"] == 0 and found["jobs"] >= 40
    assert "<checkout>" in (tmp_path / "after" / "demo.stdout").read_text()

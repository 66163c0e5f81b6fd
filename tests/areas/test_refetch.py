"""The files, not the fetch marker, say what a collection holds (issue 51, items 7 and 10): a
tile deleted after rule fetch_tiles wrote its marker is fetched again by the next run (and
only that tile; the VRTs, the same bytes beneath them, are not rewritten); an index row that
climbs out of the collection stops the workflow while it parses, in one line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from areas_collection import YEAR, run_snakemake
from conftest import REPO
from test_fetch import NEEDED, RangeHandler, local_copy, served, tile  # noqa: F401 - a fixture

TARGET = "results/areas/regions.tsv"
TARGETS = (TARGET, *(f"results/labels/aef/field_trial_{zone}.tif" for zone in ("14n", "15n")))


def workdir(tmp_path: Path, c, url: str) -> tuple[Path, dict]:
    collections = local_copy(c, tmp_path)
    collections["aef"]["url"] = url
    collections["cdl"] = {"path": str(c.cdl_one).replace(str(YEAR), "{year}")}
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    settings = {"regions": "", "areas": str(c.areas), "collections": collections,
                "runs": ["aef_segformer"]}  # fmt: skip
    (work / "areas.yaml").write_text(yaml.safe_dump(settings))
    return work, collections


def test_a_tile_deleted_after_its_fetch_is_fetched_again(served, tmp_path: Path) -> None:  # noqa: F811
    """The next run fetches that tile alone (even where its folder keeps the time it had
    before); the VRTs (the same, over the same bytes) and the labels aligned on them are not
    made again."""
    c, url = served
    work, _ = workdir(tmp_path, c, url)
    first = run_snakemake(work, ["areas.yaml"], "--cores", "1", *TARGETS)
    assert first.returncode == 0, first.stderr[-3000:]
    labels = [work / t for t in TARGETS[1:]]
    vrts = sorted((work / "resources/areas").rglob("*.vrt"))
    made = {p: p.stat().st_mtime_ns for p in [*labels, *vrts]}
    gone = tile(tmp_path / "aef", NEEDED[1])
    folder_time = gone.parent.stat().st_mtime_ns
    gone.unlink()  # a user's clean-up, a disk replaced: the marker still says fetched
    os.utime(gone.parent, ns=(folder_time, folder_time))  # its folder as a backup restores it

    dry = run_snakemake(work, ["areas.yaml"], "-n", *TARGETS)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "rule fetch_tiles:" in dry.stdout and "rule areas:" not in dry.stdout, dry.stdout
    RangeHandler.requests.clear()
    again = run_snakemake(work, ["areas.yaml"], "--cores", "1", *TARGETS)
    assert again.returncode == 0, again.stderr[-3000:]
    assert gone.read_bytes() == tile(c.aef, NEEDED[1]).read_bytes()
    assert [p for p, _ in RangeHandler.requests] == [f"/{YEAR}/{NEEDED[1]}" +
                                                     "-0000000000-0000000000.tiff"]  # fmt: skip
    assert "fetch aef: 1 tiles missing" in (work / "logs/areas/fetch_aef.log").read_text()
    assert "rule areas:" not in again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in [*labels, *vrts]} == made  # nothing else reran
    settled = run_snakemake(work, ["areas.yaml"], "-n", *TARGETS)
    assert "Nothing to be done" in settled.stdout, settled.stdout[-3000:]


def test_an_index_row_out_of_the_collection_stops_the_parse_in_one_line(
    served,  # noqa: F811
    tmp_path: Path,
) -> None:
    c, url = served
    work, collections = workdir(tmp_path, c, url)
    index = Path(collections["aef"]["index"])
    table = pq.read_table(index)
    paths = table.column("path").to_pylist()
    paths[next(i for i, p in enumerate(paths) if NEEDED[1].split("/")[1] in p)] = "../../x.tiff"
    pq.write_table(
        table.set_column(table.column_names.index("path"), "path", pa.array(paths)), index
    )
    RangeHandler.requests.clear()
    dry = run_snakemake(work, ["areas.yaml"], "-n", TARGET)
    printed = dry.stdout + dry.stderr
    assert dry.returncode == 1, printed[-3000:]
    lines = [s for s in printed.splitlines() if "index row '../../x.tiff'" in s]
    assert len(lines) == 1 and "outside the collection folder" in lines[0], printed[-3000:]
    assert "Traceback" not in printed and RangeHandler.requests == []

"""One prediction job maps every region of a run, so a failure or a preemption must not cost the
maps already made: regions are shared over ranks by pixel count alone (the same split on every
rank), maps wait in a staging folder that survives a failed attempt and whose maps the next
attempt keeps only when the same checkpoint made them from the same rasters, and the output
folder appears only when every rank is done, holding exactly the maps of the listed regions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
from conftest import CLASSES_CSV, TinyDemo, corrupt_copy, venv_env
from rasterio.transform import from_origin
from tiny_runs import tiny_run

from emb.evaluation.region_maps import (
    RegionInput,
    RegionMapsError,
    Staging,
    regions_with,
    share_of_rank,
)
from emb.prep.demo_region import DEMO_REGIONS
from emb.training import checkpoint_file

REGIONS = [r.name for r in DEMO_REGIONS]
HEADER = ["region", "year", "aef", "tessera", "cdl", "split"]
MAP_SUFFIXES = (".tif", ".png", ".qml", ".tif.aux.xml")


@pytest.fixture(scope="module")
def trained(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AEF run: the maps need not be good, only made (and kept) by one checkpoint."""
    return tiny_run(tiny_demo, tmp_path_factory.mktemp("region_maps"), "aef", "segformer",
                    steps=6)  # fmt: skip


def write_raster(path: Path, height: int, width: int, count: int = 1) -> Path:
    """A small int8 GeoTIFF (projected, north-up) of ``height`` x ``width`` pixels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    profile = {"driver": "GTiff", "height": height, "width": width, "count": count,
               "dtype": "int8", "crs": "EPSG:32614",
               "transform": from_origin(600_000.0, 4_560_000.0, 10.0, 10.0)}  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(np.ones((count, height, width), np.int8))
    return path


def write_table(path: Path, rows: list[dict[str, str]], header: list[str] = HEADER) -> Path:
    """A regions.tsv: ``header``, then one line per row (missing cells empty)."""
    lines = ["\t".join(header)] + ["\t".join(row.get(col, "") for col in header) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def sized_regions(folder: Path, shapes: dict[str, tuple[int, int]]) -> list[RegionInput]:
    return [RegionInput(name, write_raster(folder / f"{name}.tif", h, w))
            for name, (h, w) in shapes.items()]  # fmt: skip


SHAPES = {"r0": (40, 40), "r1": (10, 10), "r2": (30, 20), "r3": (8, 8), "r4": (25, 25),
          "r5": (12, 30), "r6": (5, 5), "r7": (36, 36)}  # fmt: skip


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_region_lands_on_exactly_one_rank_whichever_rank_computes_the_split(
    tmp_path: Path, world: int
) -> None:
    regions = sized_regions(tmp_path, SHAPES)
    shares = [[r.region for r in share_of_rank(regions, rank, world)] for rank in range(world)]
    names = [name for share in shares for name in share]
    assert sorted(names) == sorted(SHAPES)  # each once: none lost, none mapped twice
    reordered = regions[::-1]  # another rank, or the same table read in another order
    again = [[r.region for r in share_of_rank(reordered, rank, world)] for rank in range(world)]
    assert again == shares


@pytest.mark.parametrize("world", [2, 3, 4])
def test_large_rasters_are_spread_so_rank_loads_differ_by_at_most_the_largest_raster(
    tmp_path: Path, world: int
) -> None:
    regions = sized_regions(tmp_path, SHAPES)
    area = {name: h * w for name, (h, w) in SHAPES.items()}
    loads = [sum(area[r.region] for r in share_of_rank(regions, rank, world))
             for rank in range(world)]  # fmt: skip
    assert min(loads) > 0
    assert max(loads) - min(loads) <= max(area.values())
    largest = sorted(area, key=area.get, reverse=True)[:world]
    owners = {rank for rank in range(world)
              for r in share_of_rank(regions, rank, world) if r.region in largest}  # fmt: skip
    assert len(owners) == world  # the `world` largest rasters each on a rank of their own


@pytest.mark.parametrize(("rank", "world"), [(2, 2), (-1, 2), (0, 0)])
def test_a_rank_outside_the_world_is_refused(tmp_path: Path, rank: int, world: int) -> None:
    regions = sized_regions(tmp_path, {"r0": (4, 4)})
    with pytest.raises(RegionMapsError, match=f"rank {rank} of {world}"):
        share_of_rank(regions, rank, world)


def test_rows_without_a_raster_of_the_source_are_skipped_and_cdl_is_optional(
    tmp_path: Path,
) -> None:
    table = write_table(tmp_path / "regions.tsv", [
        {"region": "a", "year": "2024", "aef": "/x/a_aef.tif", "cdl": "/x/a_cdl.tif"},
        {"region": "b", "year": "2024", "tessera": "/x/b_tessera.tif", "cdl": "/x/b_cdl.tif"},
        {"region": "c", "year": "2024", "aef": "/x/c_aef.tif", "tessera": "/x/c_tessera.tif"},
    ])  # fmt: skip
    assert regions_with(table, "aef") == [
        RegionInput("a", Path("/x/a_aef.tif"), Path("/x/a_cdl.tif"), "2024", False, "2024"),
        RegionInput("c", Path("/x/c_aef.tif"), None, "2024", False, "2024"),
    ]
    assert regions_with(table, "tessera") == [
        RegionInput("b", Path("/x/b_tessera.tif"), Path("/x/b_cdl.tif"), "2024", False, "2024"),
        RegionInput("c", Path("/x/c_tessera.tif"), None, "2024", False, "2024"),
    ]
    no_cdl = write_table(tmp_path / "no_cdl.tsv", [{"region": "a", "aef": "/x/a_aef.tif"}],
                         header=["region", "aef"])  # fmt: skip
    assert regions_with(no_cdl, "aef") == [RegionInput("a", Path("/x/a_aef.tif"), None)]


def test_a_table_where_no_row_has_the_source_is_refused_naming_the_table(tmp_path: Path) -> None:
    table = write_table(tmp_path / "regions.tsv", [
        {"region": "a", "aef": "/x/a_aef.tif"}, {"region": "b", "aef": "/x/b_aef.tif"},
    ])  # fmt: skip
    with pytest.raises(RegionMapsError, match=re.escape(f"{table}: no region has a tessera")):
        regions_with(table, "tessera")


def test_a_table_without_the_source_column_is_refused_naming_the_column(tmp_path: Path) -> None:
    table = write_table(tmp_path / "regions.tsv", [{"region": "a", "aef": "/x/a_aef.tif"}],
                        header=["region", "year", "aef", "cdl"])  # fmt: skip
    with pytest.raises(RegionMapsError, match=re.escape(f"{table}: no column 'tessera'")):
        regions_with(table, "tessera")


def predict_regions(run_dir: Path, table: Path, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "emb.evaluation.predict", "--run-dir", str(run_dir),
           "--regions", str(table), "--classes", str(CLASSES_CSV), "--out-dir", str(out),
           "--threads", "1", "--overlap=0.5", "--block=1024", "--batch-size=16"]  # fmt: skip
    return subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=600)


def demo_rows(demo: TinyDemo) -> list[dict[str, str]]:
    return [{"region": name, "year": "2024", "aef": str(demo.rasters[name]["aef"]),
             "tessera": str(demo.rasters[name]["tessera"]), "cdl": str(demo.rasters[name]["cdl"]),
             "split": "auto"} for name in REGIONS]  # fmt: skip


def stats(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()
            if not p.name.startswith(".")}  # fmt: skip


def fail_on_a_bad_region(run_dir: Path, demo: TinyDemo, tmp_path: Path) -> tuple[Path, Path]:
    """A first attempt that maps the demo regions, then fails on a third: (table, out)."""
    # The bad raster opens but has 3 bands where the run wants 64: its map fails. It is the
    # smallest, so the demo regions (largest first) are mapped before it.
    bad = write_raster(tmp_path / "bad" / "aef.tif", 16, 16, count=3)
    table = write_table(tmp_path / "regions.tsv",
                        [*demo_rows(demo), {"region": "bad_region", "aef": str(bad)}])  # fmt: skip
    out = tmp_path / "maps" / "aef_segformer"
    failed = predict_regions(run_dir, table, out)
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "region 'bad_region'" in failed.stderr
    return table, out


def test_a_failed_job_leaves_its_maps_staged_and_the_next_attempt_keeps_them(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    table, out = fail_on_a_bad_region(trained, tiny_demo, tmp_path)
    staging = out.parent / ".partial" / out.name
    assert not out.exists()  # nothing published
    made = stats(staging)
    assert sorted(made) == sorted(f"{r}{s}" for r in REGIONS for s in MAP_SUFFIXES)

    write_table(table, demo_rows(tiny_demo))  # the bad row dropped
    done = predict_regions(trained, table, out)
    assert done.returncode == 0, done.stderr[-3000:]
    for region in REGIONS:
        assert f"region {region}: kept the map an earlier attempt made" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(made)
    assert stats(out) == made  # moved, not made again
    assert not staging.exists() and not staging.parent.exists()
    for region in REGIONS:
        with rasterio.open(out / f"{region}.tif") as dst, \
                rasterio.open(tiny_demo.rasters[region]["aef"]) as src:  # fmt: skip
            assert dst.shape == src.shape and dst.tags()["REGION"] == region


def test_maps_staged_with_another_checkpoint_are_made_again(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    run_dir = shutil.copytree(trained, tmp_path / "run")
    table, out = fail_on_a_bad_region(run_dir, tiny_demo, tmp_path)
    staged = stats(out.parent / ".partial" / out.name)
    state = checkpoint_file.load(run_dir / "best.pt")
    checkpoint_file.save(run_dir / "best.pt", {**state, "epoch": state["epoch"] + 1})  # trained on

    write_table(table, demo_rows(tiny_demo))
    done = predict_regions(run_dir, table, out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kept the map" not in done.stderr
    remade = stats(out)
    assert sorted(remade) == sorted(staged)
    for region in REGIONS:
        name = f"{region}.tif"
        assert remade[name] != staged[name], name


def test_an_unreadable_raster_fails_the_job_naming_its_region(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    table = write_table(tmp_path / "regions.tsv", [
        *demo_rows(tiny_demo), {"region": "lost_region", "aef": str(tmp_path / "lost.tif")},
    ])  # fmt: skip
    out = tmp_path / "maps" / "aef_segformer"
    done = predict_regions(trained, table, out)
    assert done.returncode == 2  # bad input: the table names a raster that is not there
    assert "region 'lost_region'" in done.stderr, done.stderr[-3000:]
    assert not out.exists()
    staged = out.parent / ".partial" / out.name  # it came last: the others are staged
    assert {p.name for p in staged.glob("*.tif")} == {f"{r}.tif" for r in REGIONS}


def stage_files(staging: Staging, region: str) -> None:
    """Stand-ins for a region's staged files (``is_done`` and ``finish`` only look for them)."""
    staging.folder.mkdir(parents=True, exist_ok=True)
    for path in staging.published_files(region):
        path.write_text(f"{region} {path.suffix}\n")
    staging.files(region).map.with_name(f"{region}.tif.aux.xml").write_text("<PAMDataset/>\n")


IDENTITY = {"checkpoint": "1f2e", "weights": "raw", "spec": [32, 0.5, 1024, 16]}


def test_a_staged_map_is_kept_only_when_made_by_this_checkpoint_from_these_rasters(
    tmp_path: Path,
) -> None:
    raster = write_raster(tmp_path / "a_aef.tif", 8, 8)
    cdl = write_raster(tmp_path / "a_cdl.tif", 8, 8)
    item = RegionInput("a", raster, cdl)
    staging = Staging(tmp_path / ".partial" / "run", tmp_path / "run", IDENTITY, False)
    stage_files(staging, "a")
    assert not staging.is_done(item)  # files without a marker: an attempt cut short
    staging.mark_done(item)
    assert staging.is_done(item)
    assert Staging(staging.folder, staging.out_dir, dict(IDENTITY), False).is_done(item)

    other = {**IDENTITY, "checkpoint": "9a0b"}  # another checkpoint
    assert not Staging(staging.folder, staging.out_dir, other, False).is_done(item)
    # asked for probabilities too: the staged map has none
    assert not Staging(staging.folder, staging.out_dir, IDENTITY, True).is_done(item)
    assert not staging.is_done(RegionInput("a", raster, None))  # coloured with another CDL

    stamp = raster.stat().st_mtime_ns
    os.utime(raster, ns=(stamp + 10**9, stamp + 10**9))  # the raster was replaced since
    assert not staging.is_done(item)
    os.utime(raster, ns=(stamp, stamp))
    assert staging.is_done(item)
    staging.files("a").png.unlink()  # a staged file lost
    assert not staging.is_done(item)


def test_maps_are_published_once_every_rank_is_done_and_only_the_listed_regions(
    tmp_path: Path,
) -> None:
    out = tmp_path / "maps" / "run"
    staging = Staging(out.parent / ".partial" / out.name, out, IDENTITY, False)
    listed = [RegionInput(name, tmp_path / f"{name}.tif") for name in ("a", "b")]
    for name in ("a", "b", "gone"):  # "gone": staged by an attempt whose table still listed it
        stage_files(staging, name)
    (staging.folder / ".rank-earlier-1-of-2").touch()  # rank 1 of an earlier launch

    assert staging.finish(0, 2, "launch", listed) is False
    assert not out.exists()
    assert staging.finish(1, 2, "launch", listed) is True
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{name}{s}" for name in ("a", "b") for s in MAP_SUFFIXES
    )
    assert (out / "a.png").read_text() == "a .png\n"
    assert not staging.folder.exists() and not staging.folder.parent.exists()


def launched(run_dir: Path, table: Path, out: Path, attempt: int) -> list[str]:
    """The predict rule's command line (its launcher options, one process)."""
    staging = out.parent / ".partial" / out.name
    return [sys.executable, "-m", "emb.cluster.launch", f"--checkpoint={staging}/.stopped",
            f"--attempt={attempt}", f"--failure-record={staging}.failed.json", "--",
            "emb.evaluation.predict", f"--run-dir={run_dir}", f"--regions={table}",
            f"--classes={CLASSES_CSV}", f"--out-dir={out}", f"--staging={staging}",
            "--threads=1", "--overlap=0.5", "--block=1024", "--batch-size=16"]  # fmt: skip


def test_a_retry_after_bad_input_ends_at_once_with_the_first_attempts_error(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    bad = write_raster(tmp_path / "bad" / "aef.tif", 16, 16, count=3)
    rows = [*demo_rows(tiny_demo), {"region": "bad_region", "aef": str(bad)}]
    table = write_table(tmp_path / "regions.tsv", rows)
    out = tmp_path / "maps" / "aef_segformer"
    first = subprocess.run(launched(trained, table, out, 1), env=venv_env(), capture_output=True,
                           text=True, timeout=600)  # fmt: skip
    assert first.returncode == 2, first.stderr[-3000:]
    staged = stats(out.parent / ".partial" / out.name)

    retry = subprocess.run(launched(trained, table, out, 2), env=venv_env(), capture_output=True,
                           text=True, timeout=600)  # fmt: skip

    assert retry.returncode == 2
    assert "attempt 1 of this job failed with exit code 2" in retry.stderr
    assert "region 'bad_region'" in retry.stderr  # why, although Snakemake dropped that log
    assert "launch:" not in retry.stdout  # nothing started
    assert stats(out.parent / ".partial" / out.name) == staged  # the good maps still kept


def test_a_job_stopped_by_a_signal_exits_75_and_its_retry_maps_only_the_rest(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """SLURM's SIGTERM at the time limit: the launcher reports a resumable stop (75), so the
    profiles' retry runs, and it keeps what the stopped attempt mapped."""
    table = write_table(tmp_path / "regions.tsv", demo_rows(tiny_demo))
    out = tmp_path / "maps" / "aef_segformer"
    staging = out.parent / ".partial" / out.name
    job = subprocess.Popen(launched(trained, table, out, 1), env=venv_env(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    lines = []
    for line in job.stdout:  # stop it once its first map is staged
        lines.append(line)
        if re.search(r"region demo_\w: staged", line):
            job.send_signal(15)
            break
    lines += job.stdout.readlines()
    assert job.wait(timeout=120) == 75, "".join(lines)[-3000:]
    assert (staging / ".stopped").is_file() and not out.exists()
    first = re.search(r"region (demo_\w): staged", "".join(lines)).group(1)

    retry = subprocess.run(launched(trained, table, out, 2), env=venv_env(), capture_output=True,
                           text=True, timeout=600)  # fmt: skip

    assert retry.returncode == 0, retry.stderr[-3000:]
    assert f"region {first}: kept the map an earlier attempt made" in retry.stderr
    assert sorted(p.name for p in out.glob("*.tif")) == [f"{r}.tif" for r in REGIONS]
    assert not staging.exists()


def test_a_raster_that_fails_past_its_first_block_is_named_by_path_and_region(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    bad = corrupt_copy(tiny_demo.rasters["demo_a"]["aef"], tmp_path / "r7" / "aef.tif")
    table = write_table(tmp_path / "regions.tsv", [{"region": "r7", "aef": str(bad)}])
    done = predict_regions(trained, table, tmp_path / "maps" / "aef_segformer")
    assert done.returncode == 66, done.stderr[-3000:]  # an unreadable input
    assert f"region 'r7' ({bad}): its map failed" in done.stderr
    assert f"{bad}: cannot read it" in done.stderr

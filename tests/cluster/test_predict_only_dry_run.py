"""1,000 prediction-only regions on a cluster profile: mapped by the one predict job per run,
never labelled, sharded or scored (no job beyond those of the training regions)."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
from test_profiles import REPO, cluster_env, dry_run, jobs_of
from test_scale_dry_run import PREP_PER_JOB, many_regions, submitted

TRAINING = 10
BIG = 4096  # pixels per side of the last (prediction-only) region's rasters
BLOCKS = "splits:\n  block_m: 10\n"  # split blocks of these 40 m regions: 4 x 4 in each
RUNS = ["aef_deeplab", "aef_segformer", "tessera_deeplab", "tessera_segformer"]


def enlarge(raster: Path, side: int) -> None:
    """Rewrite ``raster`` as a ``side`` x ``side`` sparse GeoTIFF (no block written: tiny on
    disk) on the same grid origin, so that only its header says it is large."""
    with rasterio.open(raster) as src:
        profile = src.profile
    profile.update(width=side, height=side, tiled=True, blockxsize=256, blockysize=256,
                   sparse_ok=True)  # fmt: skip
    with rasterio.open(raster, "w", **profile):
        pass


def mem_mb_of(job: dict[str, str]) -> int:
    """The ``mem_mb`` of a listed job's resources line."""
    return int(re.search(r"\bmem_mb=(\d+)", job["resources"]).group(1))


def predict_only(table: Path, training: int) -> Path:
    """The table with every row after the first ``training`` made prediction-only (no CDL)."""
    lines = table.read_text().splitlines()
    rows = [lines[0], *lines[1 : training + 1]]
    for line in lines[training + 1 :]:
        cells = line.split("\t")
        cells[4], cells[5] = "", "predict"
        rows.append("\t".join(cells))
    out = table.with_name("predict_only.tsv")
    out.write_text("\n".join(rows) + "\n")
    return out


@pytest.mark.parametrize("cluster", ["lumi"])  # betzy's job form is the same (its own test)
def test_a_thousand_prediction_only_regions_add_no_slurm_job(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, cluster: str
) -> None:
    table = predict_only(many_regions(tmp_path_factory.mktemp("inputs"), 1000), TRAINING)
    blocks = tmp_path / "blocks.yaml"
    blocks.write_text(BLOCKS)
    result = dry_run(tmp_path, Path(__file__).parents[2] / "profiles" / cluster,
                     cluster_env(tmp_path), "--configfile", "config/config.yaml", str(blocks),
                     "--config", f"regions={table}")  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    jobs = submitted(result.stdout)
    assert jobs.pop("group prep") == math.ceil(2 * TRAINING / PREP_PER_JOB)
    assert jobs == {"gpu_check": 1, "channel_stats": 2, "train": 4, "evaluate": 4, "predict": 4,
                    "area_estimates": 4}  # fmt: skip
    predict = [job for job in jobs_of(result.stdout) if job["rule"] == "predict"]
    assert all("results/regions.tsv" in job["shell"] for job in predict)
    assert "region=r0999" not in result.stdout  # no per-region job: only predict reads it


def predict_mem_mb(workdir: Path, table: Path) -> dict[str, int]:
    """{run: mem_mb} of the predict jobs a dry run (no cluster profile) lists."""
    shutil.copytree(REPO / "config", workdir / "config")
    blocks = workdir / "blocks.yaml"
    blocks.write_text(BLOCKS)
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "-n", "-p",
           "--cores", "2", "--configfile", "config/config.yaml", str(blocks), "--config",
           f"regions={table}"]  # fmt: skip
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    predict = [job for job in jobs_of(result.stdout) if job["rule"] == "predict"]
    return {re.search(r"--run-dir=results/runs/(\w+)", j["shell"]).group(1): mem_mb_of(j)
            for j in predict}  # fmt: skip


@pytest.mark.slow
def test_predict_asks_memory_for_the_largest_raster_it_maps_prediction_only_included(
    tmp_path: Path,
) -> None:
    """Without a cluster profile (whose GPU jobs take a whole node), ``predict``'s ``mem_mb``
    grows with the largest raster it maps, a prediction-only region's, which no other job
    reads: by at least the raster's bytes, up to a GiB (GDAL's block cache, which predict
    leaves at its default, holds at least that on any machine of 20 GB)."""
    table = predict_only(many_regions(tmp_path / "inputs", 4), 2)
    small = predict_mem_mb(tmp_path / "small", table)
    grown = {}
    for kind in ("aef", "tessera"):
        raster = table.parent / "r0003" / f"{kind}.tif"
        enlarge(raster, BIG)
        with rasterio.open(raster) as src:
            grown[kind] = src.width * src.height * src.count * np.dtype(src.dtypes[0]).itemsize
    big = predict_mem_mb(tmp_path / "big", table)

    assert sorted(big) == sorted(small) == sorted(RUNS)  # the demo's runs, both sources
    for run, mem_mb in big.items():
        least = min(grown[run.split("_")[0]], 2**30) / 1e6  # MB
        assert mem_mb - small[run] >= least, (run, small[run], mem_mb, least)

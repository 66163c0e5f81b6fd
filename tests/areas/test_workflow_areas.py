"""An area across a UTM zone boundary, end to end through Snakemake on the demo-sized models:
regions {area}_{zone} from AEF, TESSERA and CDL tiles; the labels equal those of the same
ground given as one raster; no ground pixel in two regions; a bad input later changes nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import rasterio
import shapely
import yaml
from areas_collection import AREA, YEAR, Collection, make_collection, run_snakemake
from conftest import REPO, venv_env
from pyproj import CRS, Transformer
from rasterio.features import geometry_mask
from rasterio.windows import from_bounds

from emb.geo import WGS84, reproject, zone_box

ZONES = {"14N": 32614, "15N": 32615}
RUNS = ["aef_segformer", "tessera_segformer"]
# The demo's small tiling, given as a user may (the areas are about 1 x 2 km per zone).
SMALL = {
    "tiles": {"size": 32, "stride": 32},
    "splits": {"block_m": 320},
    "shards": {"max_samples": 6},
}


def snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    return run_snakemake(work, [".test/config.yaml", "areas.yaml"], *args, timeout=1800)


def areas_settings(c: Collection) -> dict:
    """The config (areas.yaml) that runs the workflow over ``c``'s tiles: also the areas setup
    of bench/dry_run_identity.py."""
    return {
        "regions": "",
        "areas": str(c.areas),
        "runs": RUNS,
        **SMALL,
        "collections": {
            "aef": {"folder": str(c.aef), "index": str(c.aef_index)},
            "tessera": {"folder": str(c.tessera), "registry": str(c.tessera_registry)},
            "cdl": {"path": str(c.cdl_tiles.parent / "{year}")},
        },
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Collection, Path]:
    c = make_collection(tmp_path_factory.mktemp("collection"))
    work = tmp_path_factory.mktemp("work")
    shutil.copytree(REPO / "config", work / "config")
    shutil.copytree(REPO / ".test", work / ".test")
    (work / "areas.yaml").write_text(yaml.safe_dump(areas_settings(c)))
    result = snakemake(work, "--cores", "2")
    assert result.returncode == 0, result.stderr[-4000:]
    return c, work


def test_every_run_trains_and_maps_each_zone_region(finished) -> None:
    _, work = finished
    assert sorted(pd.read_csv(work / "results/summary.csv")["run"]) == RUNS
    table = pd.read_csv(work / "results/areas/regions.tsv", sep="\t", dtype=str)
    assert list(table["region"]) == ["field_trial_14n", "field_trial_15n"]
    for run in RUNS:
        source = run.split("_")[0]
        for region in table["region"]:
            with (
                rasterio.open(work / f"resources/areas/{region}/{source}.vrt") as emb,
                rasterio.open(work / f"results/maps/{run}/{region}.tif") as out,
            ):
                assert (out.crs, out.transform, out.shape) == (emb.crs, emb.transform, emb.shape)
                assert out.driver == "GTiff" and (out.read(1) != 255).any()


@pytest.mark.parametrize("zone", ZONES)
def test_labels_equal_those_of_the_same_ground_as_one_raster(finished, tmp_path, zone) -> None:
    """The zone's ground as one top-down GeoTIFF (masked to the part by an independent
    rasterization) and the CDL as one GeoTIFF give the labels the VRTs of tiles gave."""
    c, work = finished
    region = f"field_trial_{zone.lower()}"
    with rasterio.open(work / f"resources/areas/{region}/aef.vrt") as vrt:
        profile = {
            "driver": "GTiff",
            "crs": vrt.crs,
            "transform": vrt.transform,
            "width": vrt.width,
            "height": vrt.height,
            "count": 64,
            "dtype": "int8",
            "nodata": -128,
        }
        bounds, shape, transform = vrt.bounds, vrt.shape, vrt.transform
    part = reproject(
        shapely.box(*AREA).intersection(zone_box(zone)),
        WGS84,
        CRS.from_epsg(ZONES[zone]),
        step=0.001,
    )
    inside = ~geometry_mask([part], out_shape=shape, transform=transform)
    with rasterio.open(c.truth[zone]) as truth:
        ground = truth.read(window=from_bounds(*bounds, transform=truth.transform))
    one = tmp_path / "one.tif"
    with rasterio.open(one, "w", **profile) as out:
        out.write(np.where(inside[None], ground, -128).astype(np.int8))
    labels = tmp_path / "labels.tif"
    cmd = [
        "python",
        "-m",
        "emb.prep.align_labels",
        f"--emb={one}",
        f"--cdl={c.cdl_one}",
        f"--classes={work / 'config/classes.csv'}",
        f"--out={labels}",
        f"--report={tmp_path / 'labels.json'}",
    ]
    subprocess.run(cmd, env=venv_env(), check=True, capture_output=True, timeout=300)
    with rasterio.open(labels) as a, rasterio.open(work / f"results/labels/aef/{region}.tif") as b:
        expected, got = a.read(1), b.read(1)
        assert (a.transform, a.crs) == (b.transform, b.crs)
    assert np.array_equal(got, expected)
    assert (got != 255).sum() > 15000


def test_no_ground_pixel_is_labelled_in_two_regions(finished) -> None:
    _, work = finished
    lons = {}
    for zone, epsg in ZONES.items():
        with rasterio.open(work / f"results/labels/aef/field_trial_{zone.lower()}.tif") as src:
            rows, cols = np.nonzero(src.read(1) != 255)
            x, y = rasterio.transform.xy(src.transform, rows, cols)
        t = Transformer.from_crs(CRS.from_epsg(epsg), WGS84, always_xy=True)
        lons[zone] = t.transform(np.asarray(x), np.asarray(y))[0]
    assert lons["14N"].max() < -96.0 < lons["15N"].min()


def test_a_bad_input_later_is_refused_and_changes_nothing(finished) -> None:
    c, work = finished
    again = snakemake(work, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    vrts = sorted((work / "resources/areas").rglob("*.vrt"))
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in vrts}
    victim = c.aef / str(YEAR) / "15N" / "x1y1-0000000000-0000000000.tiff"
    moved = victim.with_suffix(".moved")
    victim.rename(moved)
    try:
        result = snakemake(work, "--cores", "1")
    finally:
        moved.rename(victim)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "x1y1-0000000000" in line]
    assert len(lines) == 1 and "field_trial" in lines[0] and "not in the folder" in lines[0]
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in vrts} == before

"""A ``tessera:`` collection of geotessera's own tile form (``grid_X_Y.npy`` + ``_scales.npy``
+ landmask GeoTIFF) gives the same mosaics as one of its GeoTIFF exports: each tile converted
once, by rule areas, into the project's resources."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import rasterio
from areas_collection import YEAR, Collection, make_collection

from emb.areas.build import build
from emb.areas.plan import plan_areas
from emb.areas.tessera_tiles import NPY_OUT


def to_npy(tiff: Path, root: Path) -> tuple[Path, float]:
    """The GeoTIFF as geotessera downloads it; returns the .npy and its largest scale."""
    with rasterio.open(tiff) as src:  # cropped to its written pixels: a small, fast tile
        rows, cols = np.nonzero(src.read(1))
        window = rasterio.windows.Window(
            cols.min(), rows.min(), cols.max() + 1 - cols.min(), rows.max() + 1 - rows.min()
        )
        x, profile = src.read(window=window), src.profile
        profile.update(transform=src.window_transform(window), width=x.shape[2], height=x.shape[1])
    name = tiff.parent.name
    scale = np.abs(x).max(axis=0) / 127.0  # per pixel, as geotessera's (H, W) scales
    q = np.where(scale > 0, np.rint(x / np.where(scale > 0, scale, 1)), 0).astype(np.int8)
    npy = root / "global_0.1_degree_representation" / str(YEAR) / name / f"{name}.npy"
    npy.parent.mkdir(parents=True)
    np.save(npy, np.ascontiguousarray(q.transpose(1, 2, 0)))
    np.save(npy.with_name(f"{name}_scales.npy"), scale.astype(np.float32))
    mask = root / "global_0.1_degree_tiff_all" / f"{name}.tiff"
    mask.parent.mkdir(parents=True, exist_ok=True)
    keys = ("crs", "transform", "width", "height")
    with rasterio.open(mask, "w", driver="GTiff", count=1, dtype="uint8",
                       **{k: profile[k] for k in keys}) as out:  # fmt: skip
        out.write(np.ones((1, profile["height"], profile["width"]), np.uint8))
    return npy, float(scale.max())


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    return make_collection(tmp_path_factory.mktemp("npy"))


def built(c: Collection, tessera: Path, work: Path) -> dict[str, np.ndarray]:
    """The TESSERA mosaic of each region, built in ``work`` as rule areas would."""
    collections = {
        "tessera": {"folder": str(tessera)},
        "cdl": {"path": str(c.cdl_tiles.parent / "{year}")},
    }
    work.mkdir()
    cwd = Path.cwd()
    os.chdir(work)
    try:
        build(c.areas, collections, work / "regions.tsv")
        plan = plan_areas(c.areas, collections)
        out = {}
        for r in plan.regions:
            with rasterio.open(r.mosaics["tessera"].vrt) as src:
                out[r.region] = src.read()
        return out
    finally:
        os.chdir(cwd)


def test_npy_tiles_mosaic_as_their_geotiffs_and_convert_once(
    collection: Collection, tmp_path: Path
) -> None:
    c = collection
    tiffs = sorted(c.tessera.glob(f"{YEAR}/grid_*/*.tiff"))
    scales = [to_npy(t, tmp_path / "npy")[1] for t in tiffs]
    want = built(c, c.tessera, tmp_path / "tiff_work")
    got = built(c, tmp_path / "npy", tmp_path / "npy_work")
    assert sorted(got) == sorted(want) and got
    for region, w in want.items():
        g = got[region]
        assert g.shape == w.shape
        valid = np.isfinite(w) & (w != 0).any(axis=0)
        assert valid.sum() > 1000 and np.isfinite(g[valid]).all()
        assert np.abs(g[valid] - w[valid]).max() <= max(scales) / 2 + 1e-6
    converted = sorted((tmp_path / "npy_work" / NPY_OUT).rglob("*.tiff"))
    assert len(converted) == len(tiffs)
    stamps = [p.stat().st_mtime_ns for p in converted]
    cwd = Path.cwd()
    os.chdir(tmp_path / "npy_work")
    try:  # a second build reads the converted tiles, converts nothing
        collections = {"tessera": {"folder": str(tmp_path / "npy")}}
        build(c.areas, collections, tmp_path / "npy_work" / "again.tsv")
    finally:
        os.chdir(cwd)
    assert [p.stat().st_mtime_ns for p in converted] == stamps

"""Alignment equals an independent pixel-centre lookup for any embedding CRS, grid and origin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from conftest import TinyDemo
from rasterio.warp import transform as warp_transform
from rasterio.warp import transform_bounds

from emb.classes import ClassMap
from emb.prep.align_labels import align_labels

# (CRS, pixel size in CRS units, origin shift as a fraction of a pixel, bottom-up?)
GRIDS = [
    ("EPSG:32615", 10.0, 0.37, True),  # UTM 15N, stored bottom-up like the AEF COGs
    ("EPSG:32615", 7.5, 0.81, False),  # other resolution and origin
    ("EPSG:4326", 0.0001, 0.5, False),  # geographic degrees
    ("EPSG:3857", 13.0, 0.2, True),  # web mercator, bottom-up
]


def write_embedding(path: Path, crs: str, res: float, shift: float, bottom_up: bool, bounds):
    """A 64-band int8 raster (AEF format) over the middle of ``bounds`` (in ``crs``)."""
    left, bottom, right, top = bounds
    width = height = 96
    x0 = (left + right) / 2 - width * res / 2 + shift * res
    y0 = (bottom + top) / 2 - height * res / 2 + shift * res
    if bottom_up:
        transform = Affine(res, 0, x0, 0, res, y0)
    else:
        transform = Affine(res, 0, x0, 0, -res, y0 + height * res)
    data = np.random.default_rng(0).integers(-127, 128, (64, height, width), dtype=np.int8)
    data[:, 5:9, 40:50] = -128  # a nodata hole
    with rasterio.open(path, "w", driver="GTiff", count=64, height=height, width=width,
                       dtype="int8", crs=crs, transform=transform, nodata=-128) as dst:  # fmt: skip
        dst.write(data)
    return path


def pixel_centre_lookup(emb_path: Path, cdl_path: Path, cmap: ClassMap) -> np.ndarray:
    """Transform each pixel centre to the CDL CRS and read the containing CDL cell."""
    with rasterio.open(emb_path) as emb, rasterio.open(cdl_path) as cdl:
        rows, cols = np.mgrid[: emb.height, : emb.width]
        xs, ys = emb.transform @ (cols.ravel() + 0.5, rows.ravel() + 0.5)
        cx, cy = warp_transform(emb.crs, cdl.crs, xs, ys)
        c, r = ~cdl.transform @ (np.asarray(cx), np.asarray(cy))
        c, r = np.floor(c).astype(int), np.floor(r).astype(int)
        codes = np.zeros(c.shape, np.uint8)
        inside = (r >= 0) & (r < cdl.height) & (c >= 0) & (c < cdl.width)
        codes[inside] = cdl.read(1)[r[inside], c[inside]]
        out = cmap.cdl_to_l3[codes].reshape(emb.height, emb.width)
        out[(emb.read() == -128).any(0)] = 255
        return out


@pytest.mark.parametrize("crs, res, shift, bottom_up", GRIDS)
def test_alignment_matches_pixel_centre_lookup(tiny_demo: TinyDemo, class_map, tmp_path,
                                               crs, res, shift, bottom_up) -> None:  # fmt: skip
    cdl = tiny_demo.rasters["demo_a"]["cdl"]
    with rasterio.open(cdl) as src:
        bounds = transform_bounds(src.crs, crs, *src.bounds)
    emb = write_embedding(tmp_path / "emb.tif", crs, res, shift, bottom_up, bounds)
    out = tmp_path / "labels.tif"
    align_labels(emb, cdl, class_map, out, block=40)
    got = rasterio.open(out).read(1)
    expected = pixel_centre_lookup(emb, cdl, class_map)
    agreement = (got == expected).mean()
    assert agreement >= 0.995, f"{crs}: {agreement:.4f} of pixels agree"
    assert (expected != 255).mean() > 0.5  # the comparison is over labelled ground

"""A small synthetic but realistic demo region, so the workflow runs with no real data.

Fields are Voronoi polygons in the region's UTM CRS, each carrying one CDL code drawn with
Iowa-like frequencies. Every raster is sampled from that one scene: the CDL on its own
EPSG:5070 30 m grid, AEF (64 x int8, nodata -128) and TESSERA (128 x float32, NaN nodata) on
10 m UTM grids with different origins. Embeddings are class prototype + field-level +
pixel-level noise, so the labels are learnable but not trivially so. Everything is a pure
function of the seed.
"""

from __future__ import annotations

import argparse
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform as warp_transform
from rasterio.warp import transform_bounds

from emb import stage_runner
from emb.classes import load_class_map
from emb.config_schema import config_option
from emb.rasters import AEF_NODATA, BANDS, dequantize_tessera, quantize_aef, quantize_tessera

# CDL code -> relative frequency (Iowa-like). 63 and 81 are pre-2008 codes absent from
# classes.csv, so the demo exercises the "unmapped code -> ignore" path.
CDL_FREQUENCIES = {
    1: 0.33,
    5: 0.28,
    176: 0.09,
    141: 0.05,
    121: 0.03,
    122: 0.02,
    36: 0.03,
    37: 0.03,
    24: 0.02,
    111: 0.02,
    190: 0.02,
    61: 0.01,
    28: 0.01,
    195: 0.01,
    63: 0.01,
    81: 0.005,
}
log = logging.getLogger(__name__)
CDL_CRS = CRS.from_epsg(5070)
CDL_RES = 30.0
EMB_RES = 10.0
FIELD_SPACING_M = 400.0


@dataclass(frozen=True)
class DemoRegion:
    """Where a demo region lies; ``bottom_up`` writes AEF like the real COGs (transform.e > 0)."""

    name: str
    epsg: int
    centre: tuple[float, float]
    bottom_up: bool


DEMO_REGIONS = (
    DemoRegion("demo_a", 32615, (450_000.0, 4_650_000.0), bottom_up=True),
    DemoRegion("demo_b", 32614, (600_000.0, 4_560_000.0), bottom_up=False),
)


class Scene:
    """Voronoi fields with a CDL code each, in the region's UTM metres."""

    def __init__(self, rng: np.random.Generator, bounds: tuple[float, float, float, float]):
        left, bottom, right, top = bounds
        gx = np.arange(left - FIELD_SPACING_M, right + FIELD_SPACING_M, FIELD_SPACING_M)
        gy = np.arange(bottom - FIELD_SPACING_M, top + FIELD_SPACING_M, FIELD_SPACING_M)
        xx, yy = np.meshgrid(gx, gy)
        jitter = rng.uniform(-0.45, 0.45, (2, *xx.shape)) * FIELD_SPACING_M
        self.seeds = np.stack([xx + jitter[0], yy + jitter[1]], -1).reshape(-1, 2)
        codes = np.array(list(CDL_FREQUENCIES))
        p = np.array(list(CDL_FREQUENCIES.values()))
        self.codes = rng.choice(codes, size=len(self.seeds), p=p / p.sum()).astype(np.uint8)

    def field_of(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Field index of each point (nearest seed), chunked to bound memory."""
        pts = np.stack([x.ravel(), y.ravel()], -1)
        out = np.empty(len(pts), np.int64)
        for i in range(0, len(pts), 65536):
            d = ((pts[i : i + 65536, None, :] - self.seeds[None]) ** 2).sum(-1)
            out[i : i + 65536] = d.argmin(1)
        return out.reshape(x.shape)


def _pixel_centres(transform: Affine, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    cols, rows = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    return transform @ (cols, rows)


def _prototypes(rng: np.random.Generator, keys: list[int], dim: int) -> dict[int, np.ndarray]:
    """Correlated unit prototypes (pairwise cosine ~0.6) so classes overlap somewhat."""
    common = rng.standard_normal(dim)
    protos = {}
    for key in keys:
        v = common / np.linalg.norm(common) + 0.8 * rng.standard_normal(dim) / np.sqrt(dim)
        protos[key] = v / np.linalg.norm(v)
    return protos


def _latent(
    rng: np.random.Generator, fields: np.ndarray, scene: Scene, class_key: np.ndarray, dim: int
) -> np.ndarray:
    """(dim, H, W) float32: prototype + field-level + pixel-level noise, per pixel."""
    protos = _prototypes(rng, sorted(set(class_key.tolist())), dim)
    field_vec = np.stack([protos[k] for k in class_key])
    field_vec += 0.35 * rng.standard_normal(field_vec.shape) / np.sqrt(dim)
    latent = field_vec[fields].transpose(2, 0, 1)
    latent = latent + 0.45 * rng.standard_normal(latent.shape) / np.sqrt(dim)
    return latent.astype(np.float32)


def _holes(rng: np.random.Generator, height: int, width: int, n: int = 3) -> np.ndarray:
    """(H, W) bool: a few round nodata holes (cloud gaps, missing tiles)."""
    rows, cols = np.mgrid[:height, :width]
    mask = np.zeros((height, width), bool)
    for _ in range(n):
        r, c = rng.uniform(0, height), rng.uniform(0, width)
        radius = rng.uniform(0.02, 0.05) * min(height, width)
        mask |= (rows - r) ** 2 + (cols - c) ** 2 < radius**2
    return mask


def _write(path: Path, data: np.ndarray, **profile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    count, height, width = data.shape
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        count=count,
        height=height,
        width=width,
        dtype=data.dtype,
        tiled=True,
        blockxsize=256,
        blockysize=256,
        **profile,
    ) as dst:
        dst.write(data)
        if count == BANDS["aef"] and data.dtype == np.int8:
            dst.descriptions = tuple(f"A{i:02d}" for i in range(count))


def write_region(
    region: DemoRegion, size: int, out_dir: Path, classes_csv: Path, seed: int
) -> dict[str, Path]:
    """Write ``aef.tif``, ``tessera.tif`` and ``cdl.tif`` of one region; returns their paths."""
    rng = np.random.default_rng([seed, zlib.crc32(region.name.encode())])
    cmap = load_class_map(classes_csv)
    crs = CRS.from_epsg(region.epsg)
    # Snap the origin to a multiple of the demo's split blocks (config.yaml demo.overlay: 640 m)
    # so few tiles straddle.
    left = np.floor((region.centre[0] - size * EMB_RES / 2) / 1280.0) * 1280.0
    bottom = np.floor((region.centre[1] - size * EMB_RES / 2) / 1280.0) * 1280.0
    bounds = (left, bottom, left + size * EMB_RES, bottom + size * EMB_RES)
    scene = Scene(rng, (bounds[0] - 500, bounds[1] - 500, bounds[2] + 500, bounds[3] + 500))
    l3 = cmap.cdl_to_l3[scene.codes].astype(np.int64)
    class_key = np.where(l3 == 255, 1000 + scene.codes.astype(np.int64), l3)
    paths = {name: out_dir / f"{name}.tif" for name in ("aef", "tessera", "cdl")}

    # AEF: unit vectors, quantized; optionally stored bottom-up like the real COGs.
    if region.bottom_up:
        aef_tf = Affine(EMB_RES, 0, bounds[0], 0, EMB_RES, bounds[1])
    else:
        aef_tf = Affine(EMB_RES, 0, bounds[0], 0, -EMB_RES, bounds[3])
    fields = scene.field_of(*_pixel_centres(aef_tf, size, size))
    v = _latent(rng, fields, scene, class_key, BANDS["aef"])
    v /= np.linalg.norm(v, axis=0, keepdims=True)
    aef = quantize_aef(v)
    aef[:, _holes(rng, size, size)] = AEF_NODATA
    _write(paths["aef"], aef, crs=crs, transform=aef_tf, nodata=AEF_NODATA, compress="deflate")

    # TESSERA: own grid origin (offset by a non-multiple of the pixel size), float32, channels
    # with very different means and spreads so that normalization matters.
    t_size = size + 8
    tess_tf = Affine(EMB_RES, 0, bounds[0] - 43.0, 0, -EMB_RES, bounds[3] + 37.0)
    fields = scene.field_of(*_pixel_centres(tess_tf, t_size, t_size))
    z = _latent(rng, fields, scene, class_key, BANDS["tessera"]) * np.sqrt(BANDS["tessera"])
    mean = rng.uniform(-30, 30, (BANDS["tessera"], 1, 1)).astype(np.float32)
    spread = (10 ** rng.uniform(-1.5, 1.5, (BANDS["tessera"], 1, 1))).astype(np.float32)
    # Values carry TESSERA's own int8 x per-pixel-scale quantization, like its exports.
    tess = dequantize_tessera(*quantize_tessera(mean + spread * z))
    tess[:, _holes(rng, t_size, t_size)] = np.nan
    _write(paths["tessera"], tess, crs=crs, transform=tess_tf, nodata=np.nan, compress="lzw")

    # CDL: EPSG:5070, 30 m, covering both embedding grids with a margin; a corner of 0
    # (background, as outside a state's mapped area).
    left, bottom, right, top = transform_bounds(crs, CDL_CRS, *bounds)
    left, bottom = (
        np.floor(left / CDL_RES - 10) * CDL_RES,
        np.floor(bottom / CDL_RES - 10) * CDL_RES,
    )
    right, top = np.ceil(right / CDL_RES + 10) * CDL_RES, np.ceil(top / CDL_RES + 10) * CDL_RES
    width, height = int((right - left) / CDL_RES), int((top - bottom) / CDL_RES)
    cdl_tf = Affine(CDL_RES, 0, left, 0, -CDL_RES, top)
    xs, ys = _pixel_centres(cdl_tf, height, width)
    ux, uy = warp_transform(CDL_CRS, crs, xs.ravel(), ys.ravel())
    fields = scene.field_of(np.asarray(ux).reshape(xs.shape), np.asarray(uy).reshape(xs.shape))
    cdl = scene.codes[fields]
    cdl[: height // 4, -width // 6 :] = 0
    _write(paths["cdl"], cdl[None], crs=CDL_CRS, transform=cdl_tf, nodata=0, compress="deflate")
    return paths


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--region", required=True, choices=[r.name for r in DEMO_REGIONS])
    parser.add_argument("--size", type=int, **config_option("demo.size", "pixels per side"))
    parser.add_argument("--seed", type=int, **config_option("demo.seed"))
    parser.add_argument("--classes", type=Path, **config_option("classes"))
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    region = next(r for r in DEMO_REGIONS if r.name == args.region)
    for name, path in write_region(
        region, args.size, args.out_dir, args.classes, args.seed
    ).items():
        log.info("wrote %s: %s", name, path)


if __name__ == "__main__":
    main()

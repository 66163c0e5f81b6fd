"""Embedding and label products in the forms their distributors ship them, at small size.

One ground (the demo's scene: fields, their CDL codes, AEF and TESSERA sampled from them) is
written out as a user downloads it:

- AEF public COG tiles: int8, nodata -128, bottom-up (positive north-south pixel size),
  overviews, band names A00..A63.
- AEF exported from Earth Engine (``GOOGLE/SATELLITE_EMBEDDING/V1/ANNUAL``): float32 or
  float64 de-quantized values, north-up, masked pixels 0 and no nodata tag; large exports come
  as tiles named ``{name}-{row:010d}-{col:010d}.tif`` that users mosaic with a VRT.
- geotessera GeoTIFFs: float32, no nodata tag, ``TESSERA_*`` tags, bands ``Tessera_Band_i``;
  its merge helper's EPSG:3857 mosaic (bilinear); its native tiles ``grid_{lon}_{lat}.npy``
  (int8, (H, W, 128)) + ``grid_{lon}_{lat}_scales.npy`` (float32 (H, W) or (H, W, 128), NaN
  where there is no data) + the landmask GeoTIFF ``grid_{lon}_{lat}.tiff`` that carries the
  grid, in geotessera's download layout.
- NASS's national CDL ``{year}_30m_cdls.tif`` (uint8, Albers WKT without an EPSG code, a colour
  table) and the 10 m CDL ``{year}_10m_cdls.tif``.

Everything is written through rasterio and numpy; a VRT is written as the XML gdalbuildvrt
writes (relative source paths). Pure functions of their inputs: no randomness of their own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
import rasterio
import rasterio.shutil
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.warp import calculate_default_transform, reproject
from rasterio.warp import transform as warp_points

from emb.prep.demo_region import DEMO_REGIONS, write_region
from emb.rasters import AEF_NODATA, quantize_tessera

# NASS ships the national CDL in this projection as WKT with no EPSG code (it is EPSG:5070's).
NASS_ALBERS = CRS.from_wkt(
    'PROJCS["USA_Contiguous_Albers_Equal_Area_Conic_USGS_version",GEOGCS["NAD83",'
    'DATUM["North_American_Datum_1983",SPHEROID["GRS 1980",6378137,298.257222101004]],'
    'PRIMEM["Greenwich",0],UNIT["degree",0.0174532925199433]],'
    'PROJECTION["Albers_Conic_Equal_Area"],PARAMETER["latitude_of_center",23],'
    'PARAMETER["longitude_of_center",-96],PARAMETER["standard_parallel_1",29.5],'
    'PARAMETER["standard_parallel_2",45.5],PARAMETER["false_easting",0],'
    'PARAMETER["false_northing",0],UNIT["metre",1]]'
)
# A few entries of NASS's published CDL colour table (the file carries all 256).
CDL_COLOURS = {
    0: (0, 0, 0, 0),
    1: (255, 211, 0, 255),
    5: (38, 112, 0, 255),
    24: (168, 112, 0, 255),
    36: (255, 165, 226, 255),
    176: (232, 255, 191, 255),
}
AEF_BANDS = tuple(f"A{i:02d}" for i in range(64))
TESSERA_BANDS = tuple(f"Tessera_Band_{i}" for i in range(128))


@dataclass(frozen=True)
class Ground:
    """One area in emb's own form (the demo writer's): what every real form is made from."""

    aef: Path  # int8, nodata -128, bottom-up (the public COGs' orientation)
    tessera: Path  # float32, NaN holes, north-up
    cdl: Path  # uint8, EPSG:5070, 30 m


def make_ground(folder: Path, region: str = "demo_a", size: int = 128, seed: int = 7) -> Ground:
    """The demo scene of ``region`` at ``size`` px (10 m); ``seed`` changes the fields, not the
    grid (two seeds = the same ground in two years)."""
    spec = next(r for r in DEMO_REGIONS if r.name == region)
    classes = Path(__file__).resolve().parents[2] / "config" / "classes.csv"
    paths = write_region(spec, size, folder, classes, seed)
    return Ground(paths["aef"], paths["tessera"], paths["cdl"])


# --- reading and writing -------------------------------------------------------------------


def read(path: Path) -> tuple[np.ndarray, dict]:
    with rasterio.open(path) as src:
        return src.read(), src.profile.copy()


def north_up(data: np.ndarray, transform: Affine) -> tuple[np.ndarray, Affine]:
    """A bottom-up (D, H, W) raster flipped north-up, as Earth Engine and geotessera write."""
    if transform.e < 0:
        return data, transform
    top = transform.f + transform.e * data.shape[1]
    return data[:, ::-1].copy(), Affine(transform.a, 0, transform.c, 0, -transform.e, top)


def write(path: Path, data: np.ndarray, crs, transform: Affine, nodata=None,
          descriptions=None, tags: dict | None = None, **options) -> Path:  # fmt: skip
    """A tiled GeoTIFF of (D, H, W) ``data``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count, height, width = data.shape
    block = 64 if min(height, width) >= 64 else 16
    profile = dict(driver="GTiff", count=count, height=height, width=width, dtype=data.dtype,
                   crs=crs, transform=transform, nodata=nodata, tiled=True, blockxsize=block,
                   blockysize=block, compress="deflate", **options)  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
        if descriptions:
            dst.descriptions = tuple(descriptions)
        if tags:
            dst.update_tags(**tags)
    return path


def zero_patch(data: np.ndarray, rows: slice, cols: slice) -> np.ndarray:
    """``data`` with an all-zero embedding vector on every pixel of the patch."""
    out = data.copy()
    out[:, rows, cols] = 0
    return out


# --- AEF -------------------------------------------------------------------------------------


def aef_cog(ground: Ground, dest: Path, zeros: tuple[slice, slice] | None = None) -> Path:
    """The public AEF COG form: int8, nodata -128, bottom-up, 128 px blocks, two overviews,
    band names A00..A63.
    ``zeros`` puts all-zero vectors on a patch (rows, cols of the file's array)."""
    data, profile = read(ground.aef)
    if zeros:
        data = zero_patch(data, *zeros)
    plain = write(dest.with_suffix(".plain.tif"), data, profile["crs"], profile["transform"],
                  AEF_NODATA, AEF_BANDS)  # fmt: skip
    rasterio.shutil.copy(plain, dest, driver="COG", BLOCKSIZE=128, OVERVIEW_COUNT=2,
                         OVERVIEW_RESAMPLING="NEAREST", COMPRESS="DEFLATE")  # fmt: skip
    plain.unlink()
    return dest


def aef_float(ground: Ground) -> tuple[np.ndarray, np.ndarray, Affine, CRS]:
    """AEF as Earth Engine serves it: (64, H, W) de-quantized float64, north-up, masked pixels
    0; and the int8 values it came from (north-up, -128 where masked)."""
    q, profile = read(ground.aef)
    q, transform = north_up(q, profile["transform"])
    # the AEF documentation's de-quantization, written out here (not the package's own)
    values = (q.astype(np.float64) / 127.5) ** 2 * np.sign(q)
    values[q == AEF_NODATA] = 0.0
    return values, q, transform, profile["crs"]


def aef_ee_export(ground: Ground, dest: Path, dtype: str = "float32",
                  zeros: tuple[slice, slice] | None = None,
                  out_of_range: tuple[int, float] | None = None) -> Path:  # fmt: skip
    """An Earth Engine export of AEF: float32/float64, no nodata tag (masked pixels are 0),
    band names A00..A63. ``out_of_range`` = (band index, value) sets that band on a patch."""
    v, _, transform, crs = aef_float(ground)
    if zeros:
        v = zero_patch(v, *zeros)
    if out_of_range:
        band, value = out_of_range
        v[band, 40:56, 40:56] = value
    return write(dest, v.astype(dtype), crs, transform, None, AEF_BANDS)


# --- TESSERA ---------------------------------------------------------------------------------


def tessera_tags(year: int, version: str = "v1", lonlat: tuple[float, float] = (-93.65, 41.95)):
    """The tags geotessera's GeoTIFF export writes."""
    return {"TESSERA_DATASET_VERSION": version, "TESSERA_YEAR": str(year),
            "TESSERA_TILE_LAT": f"{lonlat[1]:.2f}", "TESSERA_TILE_LON": f"{lonlat[0]:.2f}",
            "TESSERA_DESCRIPTION": "GeoTessera satellite embedding tile",
            "GEOTESSERA_VERSION": "0.7.5"}  # fmt: skip


def tessera_values(ground: Ground) -> tuple[np.ndarray, dict]:
    """(128, H, W) float32 as geotessera de-quantizes it: no-data pixels are 0, not NaN."""
    data, profile = read(ground.tessera)
    return np.nan_to_num(data, nan=0.0).astype(np.float32), profile


def tessera_geotiff(ground: Ground, dest: Path, year: int = 2024, version: str = "v1",
                    zeros: tuple[slice, slice] | None = None,
                    window: tuple[slice, slice] | None = None) -> Path:  # fmt: skip
    """geotessera's GeoTIFF export: float32, no nodata tag, its tags and band names.
    ``window`` (rows, cols) writes only that part of the ground (a tile beside another)."""
    data, profile = tessera_values(ground)
    transform = profile["transform"]
    if window:
        rows, cols = window
        transform = transform * Affine.translation(cols.start or 0, rows.start or 0)
        data = data[:, rows, cols]
    if zeros:
        data = zero_patch(data, *zeros)
    return write(dest, np.ascontiguousarray(data), profile["crs"], transform, None,
                 TESSERA_BANDS, tessera_tags(year, version), predictor=3)  # fmt: skip


def broken_scale(path: Path, dest: Path) -> Path:
    """A TESSERA tile with the reported broken scale: values near -1.6e5, tags kept."""
    with rasterio.open(path) as src:
        data, profile, tags = src.read(), src.profile.copy(), src.tags()
    broken = (data * 2e3 - 1.6e5).astype(np.float32)
    broken[:, (data == 0).all(axis=0)] = 0
    return write(dest, broken, profile["crs"], profile["transform"], None, TESSERA_BANDS, tags)


def tessera_native(ground: Ground, base: Path, year: int = 2024, per_channel: bool = False,
                   version: str = "v1") -> dict[str, Path]:  # fmt: skip
    """geotessera's native tile in its download layout under ``base``:
    ``global_0.1_degree_representation/{year}/{g}/{g}.npy`` int8 (H, W, 128) and ``{g}_scales.npy``
    float32 (H, W) or (H, W, 128), NaN where there is no data; the landmask
    ``global_0.1_degree_tiff_all/{g}.tiff`` (uint8, 1 = land) that carries the grid; and
    ``tessera_metadata.json``. Returns the three paths."""
    data, profile = read(ground.tessera)  # NaN holes
    missing = ~np.isfinite(data).all(axis=0)
    if per_channel:
        amax = np.nanmax(np.abs(data), axis=(1, 2))  # per channel over the tile
        scales = np.broadcast_to(amax / 127.0, (*data.shape[1:], data.shape[0])).copy()
        q = np.rint(np.nan_to_num(data) / (amax / 127.0)[:, None, None]).astype(np.int8)
    else:
        q, scales = quantize_tessera(data)  # per pixel; scale 0 where a band is not finite
    q = q.transpose(1, 2, 0)
    scales[missing] = np.nan
    g = grid_name(profile["crs"], profile["transform"], data.shape[1:])
    tile = base / "global_0.1_degree_representation" / str(year) / g
    paths = {"embedding": tile / f"{g}.npy", "scales": tile / f"{g}_scales.npy",
             "landmask": base / "global_0.1_degree_tiff_all" / f"{g}.tiff"}  # fmt: skip
    tile.mkdir(parents=True, exist_ok=True)
    np.save(paths["embedding"], np.ascontiguousarray(q, dtype=np.int8))
    np.save(paths["scales"], scales.astype(np.float32))
    write(paths["landmask"], (~missing).astype(np.uint8)[None], profile["crs"],
          profile["transform"])  # fmt: skip
    (base / "tessera_metadata.json").write_text(
        json.dumps({"dataset_version": version, "geotessera_version": "0.11.0"}) + "\n"
    )
    return paths


def native_values(paths: dict[str, Path]) -> np.ndarray:
    """(128, H, W) float32 of a native tile as geotessera de-quantizes it (NaN scale -> NaN)."""
    q = np.load(paths["embedding"]).astype(np.float32)
    scales = np.load(paths["scales"])
    values = q * (scales if scales.ndim == 3 else scales[..., None])
    return values.transpose(2, 0, 1)


def grid_name(crs, transform: Affine, shape: tuple[int, int]) -> str:
    """geotessera's tile name: its centre on the 0.1-degree grid (..., .05 centres)."""
    x, y = transform * (shape[1] / 2, shape[0] / 2)
    (lon,), (lat,) = warp_points(crs, "EPSG:4326", [x], [y])
    centre = [np.floor(v * 10) / 10 + 0.05 for v in (lon, lat)]
    return f"grid_{centre[0]:.2f}_{centre[1]:.2f}"


# --- other CRSs and mosaics ------------------------------------------------------------------


def warp(src_path: Path, dest: Path, crs: str, resampling: Resampling,
         resolution: float | None = None) -> Path:  # fmt: skip
    """``src_path`` reprojected to ``crs`` (every band, tags and band names kept)."""
    with rasterio.open(src_path) as src:
        transform, width, height = calculate_default_transform(
            src.crs, crs, src.width, src.height, *src.bounds, resolution=resolution
        )
        out = np.zeros((src.count, height, width), src.dtypes[0])
        fill = src.nodata if src.nodata is not None else 0
        out[...] = fill
        reproject(rasterio.band(src, list(range(1, src.count + 1))), out, src_nodata=src.nodata,
                  dst_transform=transform, dst_crs=crs, dst_nodata=src.nodata,
                  resampling=resampling)  # fmt: skip
        return write(dest, out, crs, transform, src.nodata, src.descriptions, src.tags())


def tessera_mosaic_3857(tile: Path, dest: Path) -> Path:
    """geotessera's merge helper's default: tiles merged into EPSG:3857, bilinear."""
    return warp(tile, dest, "EPSG:3857", Resampling.bilinear)


def split_tiles(src_path: Path, folder: Path, name: str = "{row:010d}-{col:010d}") -> list:
    """``src_path`` cut into 2 x 2 GeoTIFF tiles in ``folder`` (same dtype, orientation, tags,
    band names); returns [(path, row, col, height, width)] in pixels of the whole."""
    with rasterio.open(src_path) as src:
        data, profile, tags, names = src.read(), src.profile, src.tags(), src.descriptions
    height, width = data.shape[1:]
    tiles = []
    for row, h in ((0, height // 2), (height // 2, height - height // 2)):
        for col, w in ((0, width // 2), (width // 2, width - width // 2)):
            path = folder / (name.format(row=row, col=col) + ".tif")
            part = np.ascontiguousarray(data[:, row : row + h, col : col + w])
            transform = profile["transform"] * Affine.translation(col, row)
            write(path, part, profile["crs"], transform, profile["nodata"], names, tags)
            tiles.append((path, row, col, h, w))
    return tiles


VRT_TYPES = {"int8": "Int8", "uint8": "Byte", "float32": "Float32", "float64": "Float64"}


def vrt_mosaic(src_path: Path, dest: Path, tile_name: str = "{row:010d}-{col:010d}") -> Path:
    """``src_path`` as a 2 x 2 mosaic: tiles under ``dest``'s folder in ``tiles/`` and a VRT
    naming them by relative path, as gdalbuildvrt writes it."""
    tiles = split_tiles(src_path, dest.parent / "tiles", tile_name)
    with rasterio.open(src_path) as src:
        count, dtype, crs, transform = src.count, src.dtypes[0], src.crs, src.transform
        height, width, nodata, names = src.height, src.width, src.nodata, src.descriptions
    bands = []
    for b in range(1, count + 1):
        sources = "".join(
            f'<ComplexSource><SourceFilename relativeToVRT="1">'
            f"{escape(str(path.relative_to(dest.parent)))}</SourceFilename>"
            f"<SourceBand>{b}</SourceBand>"
            f'<SrcRect xOff="0" yOff="0" xSize="{w}" ySize="{h}"/>'
            f'<DstRect xOff="{col}" yOff="{row}" xSize="{w}" ySize="{h}"/>'
            + (f"<NODATA>{nodata:g}</NODATA>" if nodata is not None else "")
            + "</ComplexSource>"
            for path, row, col, h, w in tiles
        )
        no = f"<NoDataValue>{nodata:g}</NoDataValue>" if nodata is not None else ""
        desc = f"<Description>{escape(names[b - 1])}</Description>" if names[b - 1] else ""
        bands.append(
            f'<VRTRasterBand dataType="{VRT_TYPES[dtype]}" band="{b}">{desc}{no}{sources}'
            "</VRTRasterBand>"
        )
    geo = ", ".join(repr(float(v)) for v in transform.to_gdal())
    dest.write_text(
        f'<VRTDataset rasterXSize="{width}" rasterYSize="{height}">'
        f"<SRS>{escape(crs.to_wkt())}</SRS><GeoTransform>{geo}</GeoTransform>"
        + "".join(bands)
        + "</VRTDataset>\n"
    )
    return dest


# --- CDL -------------------------------------------------------------------------------------


def nass_cdl(ground: Ground, folder: Path, year: int = 2024, resolution: int = 30) -> Path:
    """NASS's national CDL as distributed: ``{year}_{res}m_cdls.tif``, uint8, the Albers WKT
    without an EPSG code, a colour table, 0 = background (not a nodata tag)."""
    with rasterio.open(ground.cdl) as src:
        data, transform = src.read(), src.transform
    if resolution != 30:  # the 10 m CDL: the same fields on a finer grid
        k = 30 // resolution
        data = np.repeat(np.repeat(data, k, axis=1), k, axis=2)
        transform = transform * Affine.scale(1 / k)
    dest = folder / f"{year}_{resolution}m_cdls.tif"
    write(dest, data, NASS_ALBERS, transform)
    with rasterio.open(dest, "r+") as dst:
        dst.write_colormap(1, CDL_COLOURS)
    return dest


def crop(src_path: Path, dest: Path, rows: slice, cols: slice, tags: dict | None = None) -> Path:
    """Part of a raster as a file of its own (a tile beside another): dtype, orientation,
    nodata, band names and tags kept; ``tags`` are updated."""
    with rasterio.open(src_path) as src:
        data, profile = src.read(), src.profile
        names, kept = src.descriptions, {**src.tags(), **(tags or {})}
    transform = profile["transform"] * Affine.translation(cols.start or 0, rows.start or 0)
    part = np.ascontiguousarray(data[:, rows, cols])
    return write(dest, part, profile["crs"], transform, profile["nodata"], names, kept)

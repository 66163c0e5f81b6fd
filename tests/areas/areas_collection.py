"""A synthesized tile collection as the distributors ship it, at test size: AEF int8 COG-like
tiles (bottom-up, nodata -128) in two UTM zones with an index in the published columns,
geotessera-style TESSERA GeoTIFF tiles (0.1 degree, float32, no nodata tag, sparse) with a
manifest, and a CDL as tiles (EPSG:5070, 30 m) beside the same CDL as one raster.

Every raster is sampled from one ground truth, so the same ground given as one raster (per
zone: ``truth/aef_{zone}.tif``) can be compared with what the tiles give.
"""

from __future__ import annotations

import json
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyogrio
import rasterio
import shapely
from affine import Affine
from conftest import REPO, venv_env
from pyproj import CRS, Transformer

from emb.geo import WGS84, reproject, zone_box

YEAR = 2024
AREA = (-96.012, 42.002, -95.988, 42.020)  # crosses the 14N / 15N boundary at 96 W
ZONES = {"14N": 32614, "15N": 32615}
AEF_TILE = 96  # pixels per AEF tile side (the public ones have 8192)
CODES = np.array([1, 5, 24, 36, 176], np.uint8)  # corn, soybeans, winter wheat, alfalfa, grass


@dataclass(frozen=True)
class Collection:
    root: Path
    aef: Path  # folder laid out as the bucket: {year}/{zone}/*.tiff
    aef_index: Path  # aef_index.parquet
    tessera: Path  # {year}/grid_{lon}_{lat}/grid_{lon}_{lat}_{year}.tiff
    tessera_registry: Path
    cdl_tiles: Path  # folder of CDL tiles of YEAR
    cdl_one: Path  # the same CDL as one raster
    truth: dict[str, Path]  # zone -> the zone's AEF ground as one top-down raster
    areas: Path  # areas.gpkg-free form: GeoJSON of the one area


def ground_code(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Fields of about 200 m x 150 m, each one crop."""
    i = np.floor(lon / 0.0024).astype(np.int64)
    j = np.floor(lat / 0.00135).astype(np.int64)
    return CODES[(i * 7 + j * 13) % len(CODES)]


def _centres(transform: Affine, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    cols, rows = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    x = transform.c + cols * transform.a
    y = transform.f + rows * transform.e
    return x, y


def _to_lonlat(epsg: int, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = Transformer.from_crs(CRS.from_epsg(epsg), WGS84, always_xy=True)
    return t.transform(x, y)


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
        **profile,
    ) as out:
        out.write(data)


def aef_truth(zone: str, transform: Affine, height: int, width: int) -> np.ndarray:
    """64 x int8 embeddings of the ground: the crop's prototype plus noise, a nodata hole."""
    x, y = _centres(transform, height, width)
    lon, lat = _to_lonlat(ZONES[zone], x, y)
    code = ground_code(lon, lat)
    rng = np.random.default_rng(ZONES[zone])
    protos = np.random.default_rng(0).integers(-90, 90, (256, 64))
    data = protos[code].transpose(2, 0, 1) + rng.integers(-20, 20, (64, height, width))
    data = np.clip(data, -127, 127).astype(np.int8)
    data[:, 10:14, 20:26] = -128  # masked pixels, as the product has them
    return data


def make_collection(root: Path, area: tuple = AREA) -> Collection:
    root.mkdir(parents=True, exist_ok=True)
    aef, tessera = root / "aef", root / "tessera"
    truth = {}
    rows = []
    geom = shapely.box(*area)
    for zone, epsg in ZONES.items():
        part = reproject(geom.intersection(zone_box(zone)), WGS84, CRS.from_epsg(epsg), step=0.001)
        w, s, _, _ = part.bounds
        x0, y0 = np.floor(w / 10) * 10 - 200, np.floor(s / 10) * 10 - 200
        side = 3 * AEF_TILE
        top_down = Affine(10, 0, x0, 0, -10, y0 + side * 10)
        ground = aef_truth(zone, top_down, side, side)
        truth[zone] = root / "truth" / f"aef_{zone}.tif"
        _write(truth[zone], ground, crs=f"EPSG:{epsg}", transform=top_down, nodata=-128)
        for i in range(3):
            for j in range(3):  # j: tile row counted from the south
                tx, ty = x0 + i * AEF_TILE * 10, y0 + j * AEF_TILE * 10
                rows_td = slice(side - (j + 1) * AEF_TILE, side - j * AEF_TILE)
                block = ground[:, rows_td, i * AEF_TILE : (i + 1) * AEF_TILE]
                name = f"x{i}y{j}-0000000000-0000000000.tiff"
                path = aef / str(YEAR) / zone / name
                _write(
                    path,
                    np.flip(block, axis=1).copy(),
                    crs=f"EPSG:{epsg}",
                    transform=Affine(10, 0, tx, 0, 10, ty),
                    nodata=-128,
                    tiled=True,
                    blockxsize=32,
                    blockysize=32,
                    compress="deflate",
                )
                box = shapely.box(tx, ty, tx + AEF_TILE * 10, ty + AEF_TILE * 10)
                foot = reproject(box, CRS.from_epsg(epsg), WGS84, step=50).intersection(
                    zone_box(zone)
                )
                fw, fs, fe, fn = foot.bounds
                rows.append(
                    {
                        "fid": len(rows),
                        "year": YEAR,
                        "crs": f"EPSG:{epsg}",
                        "utm_zone": zone,
                        "path": "gs://alphaearth_foundations/satellite_embedding/v1/annual/"
                        f"{YEAR}/{zone}/{name}",
                        "utm_west": tx,
                        "utm_south": ty,
                        "utm_east": tx + AEF_TILE * 10,
                        "utm_north": ty + AEF_TILE * 10,
                        "wgs84_west": fw,
                        "wgs84_south": fs,
                        "wgs84_east": fe,
                        "wgs84_north": fn,
                        "geometry": shapely.to_wkb(foot),
                    }
                )
    index = aef / "aef_index.parquet"
    write_index(index, rows)
    registry = _tessera(tessera, area)
    cdl_tiles, cdl_one = _cdl(root / "cdl", area)
    areas = root / "areas.geojson"
    write_geojson(areas, [{"area": "field_trial", "year": YEAR, "split": "auto", "geometry": geom}])
    return Collection(root, aef, index, tessera, registry, cdl_tiles, cdl_one, truth, areas)


def write_index(path: Path, rows: list[dict]) -> None:
    """The index as a GeoParquet (WKB footprints, 'geo' metadata as the published one has)."""
    table = pa.Table.from_pylist(rows)
    geo = {
        "version": "1.0.0",
        "primary_column": "geometry",
        "columns": {"geometry": {"encoding": "WKB", "geometry_types": ["Polygon"]}},
    }
    table = table.replace_schema_metadata({b"geo": json.dumps(geo).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def write_geojson(path: Path, areas: list[dict], crs: str | None = None) -> None:
    features = [
        {
            "type": "Feature",
            "geometry": json.loads(shapely.to_geojson(a["geometry"])),
            "properties": {k: v for k, v in a.items() if k != "geometry"},
        }
        for a in areas
    ]
    doc = {"type": "FeatureCollection", "features": features}
    if crs:
        doc["crs"] = {"type": "name", "properties": {"name": crs}}
    path.unlink(missing_ok=True)  # a new file: never through a hard link to another copy
    path.write_text(json.dumps(doc))


def _tessera(folder: Path, area: tuple) -> Path:
    """One geotessera GeoTIFF per 0.1-degree cell the area meets, each in its own zone; pixels
    written only near the area (sparse: the rest reads as zero vectors, nodata)."""
    cells = []
    for lon in (-96.05, -95.95):
        lat = 42.05
        zone = "14N" if lon < -96 else "15N"
        epsg = ZONES[zone]
        cell = reproject(
            shapely.box(lon - 0.05, lat - 0.05, lon + 0.05, lat + 0.05),
            WGS84,
            CRS.from_epsg(epsg),
            step=0.001,
        )
        w, s, e, n = cell.bounds
        x0, y1 = np.floor(w / 10) * 10, np.ceil(n / 10) * 10
        width, height = int(np.ceil((e - x0) / 10)), int(np.ceil((y1 - s) / 10))
        transform = Affine(10, 0, x0, 0, -10, y1)
        name = f"grid_{lon:.2f}_{lat:.2f}"
        path = folder / str(YEAR) / name / f"{name}_{YEAR}.tiff"
        path.parent.mkdir(parents=True, exist_ok=True)
        near = reproject(shapely.box(*area).buffer(0.002), WGS84, CRS.from_epsg(epsg), step=0.001)
        window = rasterio.windows.from_bounds(*near.bounds, transform=transform).round_offsets()
        window = window.round_lengths().intersection(rasterio.windows.Window(0, 0, width, height))
        wt = rasterio.windows.transform(window, transform)
        x, y = _centres(wt, window.height, window.width)
        code = ground_code(*_to_lonlat(epsg, x, y))
        protos = np.random.default_rng(1).normal(0, 1, (256, 128)).astype(np.float32)
        noise = np.random.default_rng(epsg).normal(0, 0.3, (128, window.height, window.width))
        data = (protos[code].transpose(2, 0, 1) + noise).astype(np.float32)
        with rasterio.open(
            path,
            "w",
            driver="GTiff",
            count=128,
            width=width,
            height=height,
            dtype="float32",
            crs=f"EPSG:{epsg}",
            transform=transform,
            tiled=True,
            blockxsize=128,
            blockysize=128,
            compress="deflate",
            sparse_ok=True,
        ) as out:
            out.write(data, window=window)
        cells.append({"year": YEAR, "lon": lon, "lat": lat, "grid_size": path.stat().st_size})
    registry = folder / "manifest.parquet"
    pq.write_table(pa.Table.from_pylist(cells), registry)
    return registry


def _cdl(folder: Path, area: tuple) -> tuple[Path, Path]:
    """The CDL over the area (+ 600 m) in EPSG:5070 at 30 m: 2 x 2 tiles and one raster."""
    albers = CRS.from_epsg(5070)
    w, s, e, n = reproject(shapely.box(*area), WGS84, albers, step=0.001).buffer(600).bounds
    x0, y1 = np.floor(w / 30) * 30, np.ceil(n / 30) * 30
    width, height = int(np.ceil((e - x0) / 30)), int(np.ceil((y1 - s) / 30))
    width, height = width + width % 2, height + height % 2
    transform = Affine(30, 0, x0, 0, -30, y1)
    x, y = _centres(transform, height, width)
    codes = ground_code(*_to_lonlat(5070, x, y))[None]
    one = folder / f"{YEAR}_30m_cdls.tif"
    _write(one, codes, crs="EPSG:5070", transform=transform, nodata=0)
    tiles = folder / "tiles" / str(YEAR)
    hw, hh = width // 2, height // 2
    for i in range(2):
        for j in range(2):
            t = Affine(30, 0, x0 + i * hw * 30, 0, -30, y1 - j * hh * 30)
            block = codes[:, j * hh : (j + 1) * hh, i * hw : (i + 1) * hw]
            _write(
                tiles / f"cdl_{YEAR}_{i}_{j}.tif",
                block,
                crs="EPSG:5070",
                transform=t,
                nodata=0,
                tiled=True,
                blockxsize=16,
                blockysize=16,
            )
    return tiles, one


def write_gpkg(
    path: Path, areas: list[dict], epsg: int | None, layer: str = "areas", kind: str = "Polygon"
) -> None:
    """A GeoPackage of ``areas`` written by GDAL (pyogrio), layer ``layer`` in EPSG ``epsg``
    (None: no CRS declared); a geometry of None is written as a null one."""
    path.unlink(missing_ok=True)  # GDAL would add the layer to a file already there
    fields = ["area", "year", "split"]
    data = [
        np.array([a["area"] for a in areas], dtype=object),
        np.array([a["year"] for a in areas], dtype=np.int64),
        np.array([a.get("split", "auto") for a in areas], dtype=object),
    ]
    geometry = np.array([shapely.to_wkb(a["geometry"]) for a in areas], dtype=object)
    crs = CRS.from_epsg(epsg).to_wkt() if epsg else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "'crs' was not provided", UserWarning)  # meant so
        pyogrio.raw.write(str(path), geometry, data, fields, layer=layer, driver="GPKG",
                          geometry_type=kind, crs=crs)  # fmt: skip


def write_geoparquet(path: Path, areas: list[dict], epsg: int) -> None:
    """A GeoParquet of ``areas`` (WKB, the CRS as PROJJSON in the 'geo' metadata)."""
    rows = [
        {
            **{k: v for k, v in a.items() if k != "geometry"},
            "geometry": shapely.to_wkb(a["geometry"]),
        }
        for a in areas
    ]
    table = pa.Table.from_pylist(rows)
    geo = {
        "version": "1.0.0",
        "primary_column": "geometry",
        "columns": {
            "geometry": {
                "encoding": "WKB",
                "geometry_types": ["Polygon"],
                "crs": CRS.from_epsg(epsg).to_json_dict(),
            }
        },
    }
    pq.write_table(table.replace_schema_metadata({b"geo": json.dumps(geo).encode()}), path)


def run_snakemake(
    work: Path, configfiles: list[str], *args: str, timeout: int = 300
) -> subprocess.CompletedProcess:
    """The real workflow in ``work`` with ``configfiles`` (relative to it) and ``args``."""
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work),
           "--configfile", *configfiles, *args]  # fmt: skip
    return subprocess.run(
        cmd, cwd=work, env=venv_env(), capture_output=True, text=True, timeout=timeout
    )

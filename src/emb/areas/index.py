"""What each collection holds, without walking it: the AEF index as published, geotessera's
tile names (and manifest, where given) and CDL as a national file per year or a folder of tiles.

AEF: ``aef_index.parquet`` / ``.gpkg`` / ``.csv``, one row per COG with its WGS84 footprint
clipped to its UTM zone (``geometry``; ``wgs84_west..north`` its bounds), ``crs``, ``year``,
``utm_zone``, ``utm_west..north`` (the tile's extent in its zone) and ``path`` (the bucket
object, ``.../{year}/{zone}/{name}.tiff``: the local folder mirrors ``{year}/{zone}/``).
TESSERA: geotessera's 0.1-degree tiles ``grid_{lon:.2f}_{lat:.2f}`` (centres at 0.05), each in
its own UTM zone, as GeoTIFFs under ``{year}/grid_{lon}_{lat}/grid_{lon}_{lat}_{year}.tiff``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import shapely
from rasterio.errors import RasterioIOError

from emb.areas import AreasError
from emb.areas.tiffhead import Header, read_header
from emb.geo import read_gpkg

AEF_COLUMNS = (
    "path",
    "year",
    "crs",
    "utm_zone",
    "utm_west",
    "utm_south",
    "utm_east",
    "utm_north",
    "wgs84_west",
    "wgs84_south",
    "wgs84_east",
    "wgs84_north",
)
AEF_RESOLUTION = 10.0  # metres per pixel of every AEF COG
AEF_YEARS = range(2017, 2026)  # the annual products published so far
TESSERA_YEARS = range(2017, 2026)  # geotessera v1.1's years (2017-2025)
TESSERA_STEP = 0.1  # degrees per geotessera tile side
ZONE_DIR = re.compile(r"^\d{1,2}[NS]$")


@dataclass
class CollectionTile:
    """One file a VRT lists: where it is (or will be, once fetched) and what it must be."""

    path: Path
    key: str  # its path under the collection's base URL
    crs: str  # "EPSG:32614"
    size: tuple[int, int] | None = None  # (width, height) the index promises
    header: Header | None = None  # read when the file exists
    bounds: tuple[float, float, float, float] | None = None  # the index's extent, in ``crs``
    npy: Path | None = None  # geotessera's .npy the tile is converted from (rule areas)


@dataclass
class AefIndex:
    """The published AEF index, columns as numpy arrays (geometry kept as WKB/WKT until a
    row survives the bounding-box filter)."""

    file: Path
    frame: pd.DataFrame
    geometry: np.ndarray | None  # WKB bytes, WKT strings, or None: the wgs84 bounds serve

    @property
    def years(self) -> list[int]:
        return sorted(int(y) for y in pd.unique(self.frame["year"]))

    def select(self, year: int, zone: str, part) -> np.ndarray:
        """Rows of this year and zone whose footprint meets ``part`` (WGS84) in more than
        an edge."""
        f = self.frame
        west, south, east, north = part.bounds
        mask = (
            (f["year"].to_numpy() == year)
            & (f["zone"].to_numpy() == zone)
            & (f["wgs84_west"].to_numpy() < east)
            & (f["wgs84_east"].to_numpy() > west)
            & (f["wgs84_south"].to_numpy() < north)
            & (f["wgs84_north"].to_numpy() > south)
        )
        rows = np.flatnonzero(mask)
        if not len(rows):
            return rows
        shapes = self.footprints(rows)
        meets = shapely.intersects(shapes, part) & ~shapely.touches(shapes, part)
        return rows[meets]

    def footprints(self, rows: np.ndarray) -> np.ndarray:
        f = self.frame.iloc[rows]
        if self.geometry is None:
            return shapely.box(f["wgs84_west"], f["wgs84_south"], f["wgs84_east"], f["wgs84_north"])
        values = self.geometry[rows]
        if len(values) and isinstance(values[0], str):
            return shapely.from_wkt(values)
        return shapely.from_wkb(values)


def read_aef_index(file: str | Path) -> AefIndex:
    """The index as published (.parquet, .gpkg or .csv), its columns checked."""
    file = Path(file)
    if not file.exists():
        raise AreasError(f"{file}: AEF index not found")
    suffix = file.suffix.lower()
    try:
        if suffix == ".parquet":
            frame, geometry = _aef_parquet(file)
        elif suffix == ".gpkg":
            frame, geometry = _aef_gpkg(file)
        elif suffix == ".csv":
            frame = pd.read_csv(file)
            geometry = frame.pop("geometry").to_numpy() if "geometry" in frame else None
            if geometry is None and "WKT" in frame:
                geometry = frame.pop("WKT").to_numpy()
        else:
            raise AreasError(
                f"{file}: AEF index of an unknown format {suffix!r}: expected .parquet, .gpkg "
                "or .csv as published"
            )
    except AreasError:
        raise
    except (OSError, ValueError, KeyError) as err:
        raise AreasError(f"{file}: cannot read the AEF index: {err}") from None
    missing = [c for c in AEF_COLUMNS if c not in frame.columns]
    if missing:
        raise AreasError(
            f"{file}: AEF index without the published columns {missing}: found "
            f"{list(frame.columns)[:16]}"
        )
    frame = frame.reset_index(drop=True)
    frame["year"] = frame["year"].astype(int)
    frame["zone"] = [
        _zone(file, z, c) for z, c in zip(frame["utm_zone"], frame["crs"], strict=True)
    ]
    return AefIndex(file, frame, geometry)


def _zone(file: Path, utm_zone, crs: str) -> str:
    """``14N`` from the row's utm_zone (``14N`` or 14) and its crs (EPSG:326xx / 327xx)."""
    text = str(utm_zone).strip().upper()
    epsg = int(str(crs).rsplit(":", 1)[-1]) if str(crs).upper().startswith("EPSG:") else None
    if ZONE_DIR.match(text):
        return text
    if text.isdigit() and epsg and epsg // 100 in (326, 327):
        return f"{int(text)}{'N' if epsg // 100 == 326 else 'S'}"
    raise AreasError(
        f"{file}: utm_zone {utm_zone!r} with crs {crs!r}: expected e.g. 14N, EPSG:32614"
    )


def _aef_parquet(file: Path) -> tuple[pd.DataFrame, np.ndarray | None]:
    import pyarrow.parquet as pq

    table = pq.read_table(file)
    geometry = None
    if "geometry" in table.column_names:
        geometry = table.column("geometry").to_numpy(zero_copy_only=False)
        table = table.drop(["geometry"])
    return table.to_pandas(), geometry


def _aef_gpkg(file: Path) -> tuple[pd.DataFrame, np.ndarray | None]:
    layer = read_gpkg(file)
    return layer.table.to_pandas(), layer.wkb


def aef_local_path(folder: Path, path: str) -> tuple[Path, str]:
    """The tile's place in the local folder and its key under a base URL: the bucket's
    ``{year}/{zone}/{name}`` tail, whatever the bucket prefix (gs://, s3://, https://)."""
    parts = str(path).replace("\\", "/").split("/")
    if len(parts) >= 3 and parts[-3].isdigit() and ZONE_DIR.match(parts[-2]):
        key = "/".join(parts[-3:])
    else:
        key = str(path).lstrip("/")
    return folder / key, key


def check_in_folder(folder: Path, tile: CollectionTile, listed_in: str | Path) -> None:
    """The tile's place lies inside the collection's ``folder`` (after ``..`` and symlinks):
    an index row such as ``../../x.tiff`` must not be read from, or fetched to, outside it."""
    root = folder.resolve()
    if not tile.path.resolve().is_relative_to(root):
        raise AreasError(
            f"{listed_in}: index row {tile.key!r} would be read from or fetched to "
            f"{tile.path.resolve()}, outside the collection folder {root}: refused"
        )


# TESSERA ------------------------------------------------------------------------------------


def tessera_name(lon: float, lat: float) -> str:
    return f"grid_{lon:.2f}_{lat:.2f}"


def tessera_cells(part) -> list[tuple[float, float]]:
    """Centres of the 0.1-degree cells that meet ``part`` (WGS84) in more than an edge."""
    west, south, east, north = part.bounds
    i0, i1 = math.floor(west / TESSERA_STEP), math.ceil(east / TESSERA_STEP)
    j0, j1 = math.floor(south / TESSERA_STEP), math.ceil(north / TESSERA_STEP)
    ii, jj = np.meshgrid(np.arange(i0, i1), np.arange(j0, j1), indexing="ij")
    ii, jj = ii.ravel(), jj.ravel()
    boxes = shapely.box(
        ii * TESSERA_STEP, jj * TESSERA_STEP, (ii + 1) * TESSERA_STEP, (jj + 1) * TESSERA_STEP
    )
    keep = shapely.intersects(boxes, part) & ~shapely.touches(boxes, part)
    return [
        (round((i + 0.5) * TESSERA_STEP, 2), round((j + 0.5) * TESSERA_STEP, 2))
        for i, j in zip(ii[keep], jj[keep], strict=True)
    ]


def tessera_key(year: int, lon: float, lat: float) -> str:
    """geotessera's GeoTIFF layout: ``{year}/grid_{lon}_{lat}/grid_{lon}_{lat}_{year}.tiff``."""
    name = tessera_name(lon, lat)
    return f"{year}/{name}/{name}_{year}.tiff"


def tessera_npy_path(folder: Path, year: int, lon: float, lat: float) -> Path:
    """geotessera's download layout of a tile's embedding ``.npy`` (scales beside it, the
    landmask under ``global_0.1_degree_tiff_all/``): emb.prep.tessera_npy reads it."""
    name = tessera_name(lon, lat)
    return folder / "global_0.1_degree_representation" / str(year) / name / f"{name}.npy"


def read_tessera_registry(file: str | Path) -> set[tuple[int, int, int]]:
    """The (year, lon*100, lat*100) of every tile a geotessera manifest lists (``year``,
    ``lon``, ``lat`` columns; parquet or csv)."""
    file = Path(file)
    if not file.exists():
        raise AreasError(f"{file}: TESSERA registry not found")
    try:
        if file.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            frame = pq.read_table(file, columns=["year", "lon", "lat"]).to_pandas()
        else:
            frame = pd.read_csv(file, sep=None, engine="python", usecols=["year", "lon", "lat"])
    except (OSError, ValueError, KeyError) as err:
        raise AreasError(
            f"{file}: cannot read the TESSERA registry (expected columns year, lon, lat): {err}"
        ) from None
    lon = np.round(frame["lon"].to_numpy() * 100).astype(int)
    lat = np.round(frame["lat"].to_numpy() * 100).astype(int)
    return set(zip(frame["year"].astype(int), lon, lat, strict=True))


# CDL ----------------------------------------------------------------------------------------


def cdl_tiles(folder: Path) -> list[Header]:
    """The headers of a folder of CDL tiles (one listing of one folder, not a walk)."""
    headers = []
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() in (".tif", ".tiff"):
            try:
                headers.append(read_header(path))
            except RasterioIOError as err:
                raise AreasError(f"{path}: CDL tile cannot be read as a raster ({err})") from None
    return headers

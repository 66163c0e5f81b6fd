"""Geometry shared by the raster checks (prep) and the areas planner: UTM zones, reprojection of
shapely geometries and a GeoPackage's feature layer (read through GDAL's OGR, pyogrio)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import shapely
from pyproj import CRS, Transformer
from shapely.geometry.base import BaseGeometry

if TYPE_CHECKING:
    import pyarrow as pa

WGS84 = CRS.from_epsg(4326)
DENSIFY_DEG = 0.01  # edge pieces (degrees) before a WGS84 geometry goes into metres


UTM_ZONE_DEG = 6.0  # degrees of longitude per UTM zone


def utm_zone_number(lon: float) -> int:
    """The UTM zone number holding a longitude (zone 60 includes 180 E): the one place the
    zone arithmetic lives (areas' zone names and EPSG codes use it too)."""
    return min(60, max(1, math.floor((lon + 180.0) / UTM_ZONE_DEG) + 1))


def utm_zone_epsg(number: int, north: bool) -> int:
    """The EPSG code of WGS 84 / UTM zone ``number`` (north: 326xx, south: 327xx)."""
    return (32600 if north else 32700) + number


def utm_epsg(lon: float, lat: float) -> int:
    """The EPSG code of the WGS 84 UTM zone holding (lon, lat)."""
    return utm_zone_epsg(utm_zone_number(lon), lat >= 0)


def zone_name(number: int, north: bool) -> str:
    """The zone as the AEF bucket names its folders: ``14N``, ``33S``."""
    return f"{number}{'N' if north else 'S'}"


def zone_epsg(zone: str) -> int:
    """WGS 84 / UTM EPSG code of a zone name (``14N`` -> 32614)."""
    return utm_zone_epsg(int(zone[:-1]), zone[-1].upper() == "N")


def zone_of_crs(crs: CRS) -> str | None:
    """The zone name of a WGS 84 / UTM CRS, else None."""
    epsg = crs.to_epsg()
    if epsg is None or not (32601 <= epsg <= 32660 or 32701 <= epsg <= 32760):
        return None
    return zone_name(epsg % 100, epsg < 32700)


def zone_box(zone: str) -> BaseGeometry:
    """The zone's extent in WGS84 degrees (standard zones; north: latitude >= 0)."""
    number, north = int(zone[:-1]), zone[-1].upper() == "N"
    west = -180.0 + (number - 1) * UTM_ZONE_DEG
    return shapely.box(west, 0.0 if north else -90.0, west + UTM_ZONE_DEG, 90.0 if north else 0.0)


def zones_of(bounds: tuple[float, float, float, float]) -> list[str]:
    """Every zone a WGS84 bounding box meets, west to east, north before south."""
    west, south, east, north = bounds
    zones = []
    for number in range(utm_zone_number(west), utm_zone_number(east) + 1):
        if north > 0 or south >= 0:
            zones.append(zone_name(number, True))
        if south < 0:
            zones.append(zone_name(number, False))
    return zones


_TRANSFORMERS: dict[tuple[str, str], Transformer] = {}


def transformer(src: CRS, dst: CRS) -> Transformer:
    key = (src.to_wkt(), dst.to_wkt())
    if key not in _TRANSFORMERS:
        _TRANSFORMERS[key] = Transformer.from_crs(src, dst, always_xy=True)
    return _TRANSFORMERS[key]


def reproject(geom: BaseGeometry, src: CRS, dst: CRS, step: float | None = None) -> BaseGeometry:
    """``geom`` in ``dst``, its edges first cut into pieces of at most ``step`` source units
    (straight edges in one CRS are curves in another: a zone's meridian is curved in UTM)."""
    if src == dst:
        return geom
    if step:
        geom = shapely.segmentize(geom, step)
    t = transformer(src, dst)

    def move(coords: np.ndarray) -> np.ndarray:
        x, y = t.transform(coords[:, 0], coords[:, 1])
        return np.column_stack([x, y])

    return shapely.transform(geom, move)


@dataclass(frozen=True)
class GpkgLayer:
    """One feature layer of a GeoPackage: its attributes, geometries and CRS."""

    name: str
    table: pa.Table  # the attribute columns (no geometry, no fid)
    wkb: np.ndarray  # one WKB per feature (object array; None where the geometry is null)
    crs: str | None  # as GDAL names it: "EPSG:32615", else WKT; None when undeclared


def read_gpkg(path: str | Path) -> GpkgLayer:
    """The first feature layer (by name) of a GeoPackage, read by GDAL (the library that writes
    the samples' GeoPackage), so the format has one reader in the project. Raises ValueError,
    one line, for a file GDAL cannot open, one of another format, or one without a feature
    layer; the caller names the file. pyogrio is imported here: loading GDAL's OGR costs every
    importer of this module about a second otherwise."""
    import pyogrio
    import pyogrio.errors as gdal

    # GDAL's failures as pyogrio raises them (each a RuntimeError): a file it cannot open, a
    # layer it cannot read, a feature, field, geometry or CRS it cannot convert.
    errors = (gdal.DataSourceError, gdal.DataLayerError, gdal.FeatureError, gdal.FieldError,
              gdal.GeometryError, gdal.CRSError)  # fmt: skip
    try:
        layers = pyogrio.list_layers(path)
        driver = pyogrio.read_info(path, layer=str(layers[0][0]))["driver"] if len(layers) else ""
        if driver != "GPKG":
            found = f"a {driver} file" if driver else "a file without layers"
            raise ValueError(f"expected a GeoPackage, found {found}")
        features = sorted(str(name) for name, kind in layers if kind is not None)
        if not features:
            found = [str(name) for name, _ in layers]
            raise ValueError(
                f"a GeoPackage without a features table: expected a layer with geometries, "
                f"found only the attribute tables {found}"
            )
        meta, table = pyogrio.read_arrow(path, layer=features[0])
    except errors as err:
        first = str(err).split(";")[0].strip()  # GDAL's sentence, not its hint on drivers
        raise ValueError(f"GDAL cannot read it as a GeoPackage: {first}") from None
    column = meta["geometry_name"] or "wkb_geometry"  # pyogrio's name when GDAL gives none
    wkb = table.column(column).to_numpy(zero_copy_only=False)
    return GpkgLayer(features[0], table.drop([column]), wkb, meta["crs"])

"""Geometry shared by the raster checks (prep) and the areas planner: UTM zones, reprojection of
shapely geometries and the GeoPackage geometry blob (read with sqlite3, so no OGR binding is
needed)."""

from __future__ import annotations

import math
import struct

import numpy as np
import shapely
from pyproj import CRS, Transformer
from shapely.geometry.base import BaseGeometry

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


def gpkg_wkb(blob: bytes) -> bytes:
    """The WKB inside a GeoPackage geometry blob (header 'GP', version, flags, srs id,
    envelope of 0, 32, 48 or 64 bytes)."""
    if blob[:2] != b"GP":
        raise ValueError("not a GeoPackage geometry blob (no 'GP' magic)")
    flags = blob[3]
    envelope = {0: 0, 1: 32, 2: 48, 3: 48, 4: 64}.get((flags >> 1) & 0b111)
    if envelope is None:
        raise ValueError(f"GeoPackage geometry with an unknown envelope code {flags:#x}")
    struct.unpack("<i" if flags & 1 else ">i", blob[4:8])  # srs id: read for its length
    return blob[8 + envelope :]

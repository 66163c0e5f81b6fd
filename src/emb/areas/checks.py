"""The planner's checks: each bad input one line naming the file, the area and what was found."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import shapely
from pyproj import CRS
from rasterio.errors import RasterioIOError

from emb.areas import AreasError
from emb.areas.areas_file import Area
from emb.areas.geo import WGS84, reproject
from emb.areas.index import AEF_YEARS, AefIndex
from emb.areas.tiffhead import read_header

if TYPE_CHECKING:
    from emb.areas.plan import Tile

EXPECT = {"aef": (64, ("int8",)), "tessera": (128, ("float32", "float64"))}
GAP_M2 = 100.0  # an uncovered piece larger than one 10 m pixel is a gap
DENSIFY_DEG = 0.01  # edge pieces (degrees) before a WGS84 piece goes into metres


def check_no_overlap(file: Path, areas: list[Area]) -> None:
    """Two areas of one year on the same ground would put its pixels into two regions."""
    by_year: dict[int, list[Area]] = {}
    for area in areas:
        by_year.setdefault(area.year, []).append(area)
    for year, group in by_year.items():
        tree = shapely.STRtree([a.geometry for a in group])
        for i, j in zip(
            *tree.query([a.geometry for a in group], predicate="intersects"), strict=True
        ):
            if i < j:
                shared = group[i].geometry.intersection(group[j].geometry)
                if shared.area > 0:
                    raise AreasError(
                        f"{file}: areas {group[i].name!r} and {group[j].name!r} of {year} "
                        f"overlap (about {_km2(shared):.3f} km2 near {_lonlat(shared)}): the "
                        "same ground would be in two regions; make them disjoint"
                    )


def check_year(where: str, year: int, aef: AefIndex | None) -> None:
    if aef is None:
        return
    years = aef.years
    if year not in AEF_YEARS or year not in years:
        raise AreasError(
            f"{where}: year {year} is outside the AEF products ({AEF_YEARS[0]}-"
            f"{AEF_YEARS[-1]}) or its index {aef.file} (years {years[0]}-{years[-1]})"
        )


def check_tile(where: str, source: str, tile: Tile, listed_in, fetching: bool) -> None:
    """The file against what the index promises: present, its CRS, size, bands and type."""
    if not tile.path.exists():
        if fetching:
            return
        raise AreasError(
            f"{listed_in}: {where}: lists {tile.key}, not in the folder ({tile.path} not "
            f"found): download it (or set collections.{source}.url and let the workflow fetch it)"
        )
    try:
        tile.header = read_header(tile.path)
    except RasterioIOError as err:
        raise AreasError(
            f"{tile.path}: {where}: cannot read the tile as a raster ({err})"
        ) from None
    h = tile.header
    if h.crs is None or f"EPSG:{h.epsg}" != tile.crs:
        raise AreasError(
            f"{tile.path}: {where}: CRS {h.crs.to_string() if h.crs else None}, but "
            f"{listed_in} places it in {tile.crs}"
        )
    if tile.size and (h.width, h.height) != tile.size:
        raise AreasError(
            f"{tile.path}: {where}: {h.width} x {h.height} pixels, but {listed_in} gives its "
            f"extent as {tile.size[0]} x {tile.size[1]} pixels (a partial or other file)"
        )
    bands, dtypes = EXPECT[source]
    if h.count != bands or h.dtype not in dtypes:
        raise AreasError(
            f"{tile.path}: {where}: {h.count} bands of {h.dtype}, expected {bands} bands of "
            f"{' or '.join(dtypes)} ({source})"
        )


def check_gap(where: str, product: str, listed_in, part, boxes, crs: CRS) -> None:
    """``part`` and ``boxes`` in the projected ``crs``: a piece of the part no box covers,
    larger than a pixel, is a gap."""
    covered = shapely.union_all(list(boxes)) if len(boxes) else shapely.Polygon()
    gap = shapely.difference(part, covered)
    if gap.area > GAP_M2:
        raise_gap(where, product, listed_in, reproject(gap, crs, WGS84))


def raise_gap(where: str, product: str, listed_in, gap) -> None:
    """``gap`` in WGS84, named by its size and bounds."""
    w, s, e, n = gap.bounds
    raise AreasError(
        f"{listed_in}: {where}: no {product} tile over part of the area: a gap of about "
        f"{_km2(gap):.3f} km2 within lon {w:.4f} to {e:.4f}, lat {s:.4f} to {n:.4f}: download "
        "the missing tiles or shrink the area"
    )


def _km2(geom) -> float:
    """Area of a WGS84 geometry in km2 (in its local UTM zone's metres; messages only)."""
    if geom.is_empty:
        return 0.0
    lon, lat = geom.centroid.x, geom.centroid.y
    utm = CRS.from_epsg((32600 if lat >= 0 else 32700) + min(60, int((lon + 180) // 6) + 1))
    return reproject(geom, WGS84, utm, step=DENSIFY_DEG).area / 1e6


def _lonlat(geom) -> str:
    c = geom.centroid
    return f"lon {c.x:.4f}, lat {c.y:.4f}"

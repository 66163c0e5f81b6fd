"""The planner's checks: each bad input one line naming the file, the area and what was found."""

from __future__ import annotations

import re
from pathlib import Path

import shapely
from pyproj import CRS
from rasterio.errors import RasterioIOError

from emb.areas import AreasError
from emb.areas.areas_file import Area
from emb.areas.index import AEF_YEARS, TESSERA_YEARS, AefIndex, CollectionTile
from emb.areas.tiffhead import Header, read_header
from emb.geo import DENSIFY_DEG, WGS84, reproject, utm_epsg
from emb.rasters import BANDS, DTYPES

GAP_M2 = 100.0  # an uncovered piece larger than one 10 m pixel is a gap
# A tile's dtypes: rasters.DTYPES, but AEF tiles are the public int8 COGs (a float AEF is an
# export of a whole region, given as a table row, never a collection's tile).
TILE_DTYPES = {"aef": ("int8",), "tessera": DTYPES["tessera"]}
assert set(TILE_DTYPES["aef"]) <= set(DTYPES["aef"])
# A year in a file name (NASS names its CDL files and tiles by year: 2024_30m_cdls, CDL_2024_...).
NAME_YEAR = re.compile(r"(?<![0-9])((?:19|20)[0-9]{2})(?![0-9])")


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


def check_aef_year(where: str, year: int, aef: AefIndex | None) -> None:
    """The area's year is one the AEF products and the index hold."""
    if aef is None:
        return
    years = aef.years
    if year not in AEF_YEARS or year not in years:
        raise AreasError(
            f"{where}: year {year} is outside the AEF products ({AEF_YEARS[0]}-"
            f"{AEF_YEARS[-1]}) or its index {aef.file} (years {years[0]}-{years[-1]})"
        )


def check_tessera_year(where: str, year: int) -> None:
    """A year geotessera has no tiles of is not a coverage gap: no download would fill it."""
    if year not in TESSERA_YEARS:
        raise AreasError(
            f"{where}: year {year} is outside the TESSERA products' years "
            f"({TESSERA_YEARS[0]}-{TESSERA_YEARS[-1]}): choose a year they cover"
        )


def check_tile(
    where: str, source: str, tile: CollectionTile, listed_in: object, fetching: bool
) -> Header | None:
    """The file against what the index promises: present, its CRS, size, extent, bands and
    type. Returns its header (None: absent, left to the fetch); the planner keeps it."""
    if not tile.path.exists():
        if fetching:
            return None
        raise AreasError(
            f"{listed_in}: {where}: lists {tile.key}, not in the folder ({tile.path} not "
            f"found): download it (or set collections.{source}.url and let the workflow fetch it)"
        )
    try:
        h = read_header(tile.path)
    except RasterioIOError as err:
        raise AreasError(
            f"{tile.path}: {where}: cannot read the tile as a raster ({err})"
        ) from None
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
    if tile.bounds is not None:
        half = abs(h.transform.a) / 2
        if max(abs(a - b) for a, b in zip(h.bounds, tile.bounds, strict=True)) > half:
            raise AreasError(
                f"{tile.path}: {where}: its header places it at west, south, east, north "
                f"{_extent(h.bounds)}, but {listed_in} gives {_extent(tile.bounds)} (more than "
                "half a pixel apart): the file is not the tile its index row describes"
            )
    bands, dtypes = BANDS[source], TILE_DTYPES[source]
    if h.count != bands or h.dtype not in dtypes:
        raise AreasError(
            f"{tile.path}: {where}: {h.count} bands of {h.dtype}, expected {bands} bands of "
            f"{' or '.join(dtypes)} ({source})"
        )
    return h


def check_cdl_tile_year(where: str, header: Header, year: int) -> None:
    """A CDL tile whose name carries another year than the area's (as NASS names them):
    embeddings of one year labelled with the crops of another."""
    found = NAME_YEAR.findall(header.path.name)
    if found and str(year) not in found:
        raise AreasError(
            f"{header.path}: {where}: a CDL tile of {found[0]} (its name), but the area is of "
            f"{year}: expected the CDL tiles of {year} in this folder"
        )


def _extent(bounds: tuple[float, float, float, float]) -> str:
    return "(" + ", ".join(f"{v:.1f}" for v in bounds) + ")"


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
    utm = CRS.from_epsg(utm_epsg(geom.centroid.x, geom.centroid.y))
    return reproject(geom, WGS84, utm, step=DENSIFY_DEG).area / 1e6


def _lonlat(geom) -> str:
    c = geom.centroid
    return f"lon {c.x:.4f}, lat {c.y:.4f}"

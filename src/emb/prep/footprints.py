"""Where embedding rasters lie on the ground: ground-metre CRSs, overlaps across CRSs, and the
groups of regions that cover the same ground in different years.

Tiles and split blocks are cut in map units, so a raster must be in a CRS whose unit is a ground
metre (UTM, not Web Mercator or degrees). Two regions of one year whose footprints overlap would
draw the same ground into two regions' splits; the same ground in two years is legitimate and is
kept from leaking by giving its split blocks one draw across the years (:func:`ground_groups`).
Footprints are compared as polygons in one CRS (shapely), whatever CRSs the files come in.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyproj
import shapely
from affine import Affine
from rasterio.crs import CRS
from rasterio.warp import transform as transform_points

from emb.geo import utm_epsg

SCALE_TOLERANCE = 0.02  # UTM's scale stays within 0.9996..1.001 inside its zone


class FootprintError(ValueError):
    """Rasters whose ground cannot be split as they are."""


@dataclass(frozen=True)
class Footprint:
    """One embedding raster on the ground (what the overlap checks compare)."""

    key: str  # the region id
    where: str  # table, row, region and column, for messages
    file: str
    year: str
    crs: CRS
    transform: Affine
    shape: tuple[int, int]
    split: str = "auto"  # the row's split column ("" and "auto": spatial blocks)
    # the ground it holds, in ``crs``, where that is less than its frame (an area's masked
    # mosaic: emb.areas); None: the raster's frame
    ground: shapely.Geometry | None = None

    @property
    def pixel_m(self) -> float:
        return max(abs(self.transform.a), abs(self.transform.e))

    def polygon(self, crs: CRS | None = None) -> shapely.Geometry:
        """The raster's ground (its frame, 21 points a side), in ``crs`` (default its own)."""
        if self.ground is not None:
            shape = shapely.segmentize(self.ground, max_segment_length=50 * self.pixel_m)
        else:
            h, w = self.shape
            steps = np.linspace(0.0, 1.0, 21)
            cols = np.concatenate([steps * w, np.full(21, w), steps[::-1] * w, np.zeros(21)])
            rows = np.concatenate([np.zeros(21), steps * h, np.full(21, h), steps[::-1] * h])
            shape = shapely.Polygon(np.column_stack(self.transform * (cols, rows)))
        if crs is None or crs == self.crs:
            return shape
        return shapely.transform(shape, lambda xy: _to(self.crs, crs, xy))


def _to(src: CRS, dst: CRS, xy: np.ndarray) -> np.ndarray:
    xs, ys = transform_points(src, dst, xy[:, 0], xy[:, 1])
    return np.column_stack([xs, ys])


def _centre_lonlat(crs: CRS, transform: Affine, shape: tuple[int, int]) -> tuple[float, float]:
    x, y = transform * (shape[1] / 2, shape[0] / 2)
    lon, lat = transform_points(crs, "EPSG:4326", [x], [y])
    return lon[0], lat[0]


@functools.lru_cache(maxsize=64)
def _proj(wkt: str) -> pyproj.Proj:
    """One projection object per CRS: a table of 1,000 regions has a handful of CRSs."""
    return pyproj.Proj(pyproj.CRS.from_wkt(wkt))


def ground_metre_problem(crs: CRS, transform: Affine, shape: tuple[int, int]) -> str | None:
    """Why one map unit of ``crs`` is not a ground metre at the raster's centre, with the UTM
    zone to warp to; None when it is (within :data:`SCALE_TOLERANCE`)."""
    try:
        lon, lat = _centre_lonlat(crs, transform, shape)
    except Exception as err:  # noqa: BLE001 - PROJ fails in many ways on odd CRSs
        return f"its CRS {crs.to_string()} cannot be taken to longitude/latitude ({err})"
    target = f"EPSG:{utm_epsg(lon, lat)}"
    fix = f"warp it to its UTM zone {target} with nearest-neighbour resampling " \
          f"(gdalwarp -t_srs {target} -r near)"  # fmt: skip
    proj = _proj(crs.to_wkt())
    name = f"{crs.to_string()} ({proj.crs.name})"
    if crs.is_geographic:
        return (
            f"is in the geographic CRS {name}, measured in degrees, but tiles and "
            f"splits.block_m are measured in ground metres; {fix}"
        )
    factors = proj.get_factors(lon, lat)
    unit = crs.linear_units_factor[1] if crs.linear_units_factor else 1.0
    # ground metres per map unit along the parallel and the meridian at the centre
    scales = (unit / factors.parallel_scale, unit / factors.meridional_scale)
    where = f"one map unit is {min(scales):.3g} ground metres at its centre (lon {lon:.3f}, " \
            f"lat {lat:.3f})"  # fmt: skip
    method = getattr(proj.crs.coordinate_operation, "method_name", "") or ""
    if "pseudo mercator" in method.lower():  # geotessera's merge default; exact at the equator
        return (
            f"is in Web Mercator {name}, where {where} and a merged mosaic is usually "
            f"resampled bilinearly (blending embeddings); {fix} from the original tiles"
        )
    if all(abs(s - 1.0) <= SCALE_TOLERANCE for s in scales):
        return None
    return (
        f"is in {name}, where {where}, but tiles and splits.block_m are measured in ground "
        f"metres; {fix}"
    )


def _pairs(footprints: Sequence[Footprint]) -> list[tuple[int, int]]:
    """Index pairs whose outlines (in WGS 84) intersect, from an STRtree query."""
    if len(footprints) < 2:
        return []
    outlines = _outlines_lonlat(footprints)
    tree = shapely.STRtree(outlines)
    left, right = tree.query(outlines, predicate="intersects")
    return [(int(i), int(j)) for i, j in zip(left, right, strict=True) if i < j]


def _outlines_lonlat(footprints: Sequence[Footprint]) -> np.ndarray:
    """Each footprint's :meth:`Footprint.polygon` in WGS 84, the outlines of one CRS
    reprojected in one call (the same points, so the same coordinates): one call per raster
    was 2,000 PROJ set-ups for 1,000 regions, a second of every dry run."""
    wgs84 = CRS.from_epsg(4326)
    by_crs: dict[CRS, list[int]] = {}
    for i, footprint in enumerate(footprints):
        by_crs.setdefault(footprint.crs, []).append(i)
    outlines = np.empty(len(footprints), dtype=object)
    for crs, members in by_crs.items():
        own = np.array([footprints[i].polygon() for i in members], dtype=object)
        if crs != wgs84:
            own = shapely.transform(own, lambda xy, crs=crs: _to(crs, wgs84, xy))
        outlines[members] = own
    return outlines


def overlap_m2(a: Footprint, b: Footprint) -> float:
    """The area (square ground metres) that both rasters cover, measured in ``a``'s CRS."""
    return float(a.polygon().intersection(b.polygon(a.crs)).area)


def ground_groups(footprints: Sequence[Footprint]) -> dict[str, str]:
    """Region -> the id its split blocks are drawn with (the first region, in table order, of
    the rasters sharing its ground across years); regions alone map to themselves.

    Raises :class:`FootprintError` for two rasters of one year that share more than a pixel of
    ground (named with the overlap), or the same ground in two years in different CRSs (their
    blocks would not line up).
    """
    parent = list(range(len(footprints)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in _pairs(footprints):
        a, b = footprints[i], footprints[j]
        area = overlap_m2(a, b)
        pixel = max(a.pixel_m, b.pixel_m) ** 2
        if area <= pixel:  # a shared edge, or reprojection's sliver along it
            continue
        size = f"{area / 1e6:.3g} km2, about {area / pixel:.0f} pixels of {a.pixel_m:g} m"
        if a.year == b.year:
            raise FootprintError(
                f"{b.where}: {b.file} and {a.file} ({a.where}) are both of year {a.year} and "
                f"cover the same ground ({size}): those pixels would be drawn into two regions' "
                "splits (train and val/test); crop them to share at most an edge, or give the "
                "area once (an areas: file builds such regions without overlap)"
            )
        if a.crs != b.crs:
            raise FootprintError(
                f"{b.where}: {b.file} ({b.crs.to_string()}, {b.year}) covers ground of {a.file} "
                f"({a.crs.to_string()}, {a.year}; {size}): the same ground in two years gets "
                "the same split only when both years are in one CRS (the blocks must line up); "
                f"warp one to {a.crs.to_string()}"
            )
        low, high = sorted((root(i), root(j)))
        parent[high] = low
    groups = {f.key: footprints[root(i)].key for i, f in enumerate(footprints)}
    _check_one_kind_of_split(footprints, groups)
    return groups


def _check_one_kind_of_split(footprints: Sequence[Footprint], groups: dict[str, str]) -> None:
    """The years of one ground split either all by blocks or all by fixed splits: a year fixed
    to train beside a year split by blocks would test on ground trained on."""
    first: dict[str, Footprint] = {}
    for f in footprints:
        other = first.setdefault(groups[f.key], f)
        if _blocks(other.split) != _blocks(f.split):
            raise FootprintError(
                f"{f.where}: {f.file} (split {f.split or 'auto'!r}, {f.year}) covers ground of "
                f"{other.file} (split {other.split or 'auto'!r}, {other.year}): the years of one "
                "ground must all be split by blocks (auto), or each fixed to one split (e.g. "
                "train on one year, test on the next)"
            )


def _blocks(split: str) -> bool:
    return split in ("", "auto")


def group_extent(footprints: Sequence[Footprint], groups: dict[str, str]) -> dict[str, tuple]:
    """Group id -> the union of its members' bounds (their shared CRS), for groups of 2+."""
    members: dict[str, list[Footprint]] = {}
    for f in footprints:
        members.setdefault(groups[f.key], []).append(f)
    extents = {}
    for key, group in members.items():
        if len({f.key for f in group}) > 1:
            bounds = np.array([f.polygon().bounds for f in group])
            extents[key] = (*bounds[:, :2].min(0).tolist(), *bounds[:, 2:].max(0).tolist())
    return extents

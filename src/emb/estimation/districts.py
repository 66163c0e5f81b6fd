"""Districts: named polygons (``area_estimates.districts``) that split a run's maps into the
domains areas are estimated for, and which district each map pixel belongs to.

Three sources (``districts.source``): ``file``, a districts file; ``areas``, the areas of the
areas file (one district per area name, its polygons over every year joined), named by their
``area``; ``regions``, one district per region, the footprint of its map, named by the region
(in the maps' CRS when they share one, else in WGS84 degrees). Regions whose maps overlap
cannot be districts: a pixel must belong to one (refused, naming both).

A district file is a GeoPackage, GeoJSON (read with GDAL through pyogrio) or GeoParquet (read
with pyarrow: pyogrio's GDAL has no Parquet driver) holding one feature layer with a name
field, polygons or multipolygons, in any declared CRS. District ids follow the file's order:
1..D; 0 is the outside, the pixels no district holds, a domain of its own that is counted and
reported, never dropped.

A pixel belongs to the district that holds its centre. The polygons are moved into a map's
CRS once per map (edges cut short first, so a straight edge in one CRS stays on its curve in
the other) and burned per strip with GDAL's rasterizer without ``all_touched``, so memory stays
that of a strip. GDAL burns a pixel whose centre lies inside a polygon (holes are outside) and
none whose centre lies outside it; a centre exactly on an edge follows GDAL's scanline rule,
which gives a centre on an edge two districts share to at least one of them, never to none
(``tests/estimation/test_districts.py``). Districts that overlap by more than a sliver are
refused (a pixel counted in two districts would make their areas add up to more than the
map); where slivers (edges digitized twice) or a shared edge claim one centre twice, the first
district in the file takes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
import shapely
from affine import Affine
from pyproj import CRS
from pyproj.exceptions import CRSError
from rasterio.features import rasterize
from rasterio.windows import Window
from rasterio.windows import transform as window_transform
from shapely.geometry.base import BaseGeometry

from emb import geo
from emb.areas import AreasError
from emb.areas.areas_file import read_areas
from emb.classes import IGNORE, N_L3
from emb.estimation.population import (
    CHUNK,
    MapCrsError,
    MapFileError,
    crs_text,
    streaming,
    strips,
)

OUTSIDE = "outside"  # the name of domain 0 in tables: pixels no district holds
OUTSIDE_ID = 0
MAX_DISTRICTS = int(np.iinfo(np.uint16).max)  # ids are uint16 per pixel, 0 the outside
SLIVER = 1e-6  # overlap allowed, as a share of the smaller district's area (digitizing noise)
STEP_M = 1000.0  # longest edge piece (metres) before a projected district is reprojected
OGR_SUFFIXES = (".gpkg", ".geojson", ".json")
PARQUET_SUFFIXES = (".parquet", ".geoparquet")
POLYGONS = ("Polygon", "MultiPolygon")
SOURCES = ("file", "areas", "regions")  # districts.source (the config schema's enum)
AREA_FIELD = "area"  # the areas file's name field
REGION_FIELD = "region"  # what names a region's district


class DistrictsError(ValueError):
    """A districts file that cannot be used as it is (one line: the file, what, found)."""


@dataclass(frozen=True)
class Districts:
    """The districts of one file in its order (id = index + 1): ``names``, ``geometries``
    (shapely Polygon or MultiPolygon, valid, in ``crs``), ``path`` and ``name_field`` for
    messages."""

    path: Path
    name_field: str
    names: tuple[str, ...]
    geometries: tuple[BaseGeometry, ...]
    crs: CRS

    def names_by_id(self) -> tuple[str, ...]:
        """Domain names indexed by id: ``outside`` at 0, then the districts."""
        return (OUTSIDE, *self.names)


@dataclass(frozen=True)
class MapDistricts:
    """The districts' polygons moved into one map's CRS (once per map), ``bounds`` (D, 4)
    float64 in that CRS to skip districts far from a strip."""

    crs: CRS
    geometries: tuple[BaseGeometry, ...]
    bounds: np.ndarray


def read_districts(path: Path | str, name_field: str, layer: str | None = None) -> Districts:
    """The districts of ``path`` named by ``name_field`` (``layer``: the feature layer of a
    GeoPackage holding several). Refused, one line naming the file: a missing file or an
    unknown format, no such layer or field, no feature, an empty or duplicated name (or one
    named ``outside``), a missing, empty, non-polygon or invalid geometry, no declared CRS,
    more than 65535 districts, and districts that overlap by more than a sliver."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in OGR_SUFFIXES + PARQUET_SUFFIXES:
        raise DistrictsError(
            f"{path}: districts file of an unknown format {suffix!r}: expected one of "
            f"{', '.join(OGR_SUFFIXES + PARQUET_SUFFIXES)}"
        )
    if not path.is_file():
        raise DistrictsError(f"{path}: districts file not found")
    reader = _read_parquet if suffix in PARQUET_SUFFIXES else _read_ogr
    where, columns, wkb, crs_text_ = reader(path, layer)
    if name_field not in columns:
        raise DistrictsError(
            f"{path}: {where}: no field {name_field!r} to name the districts: found fields "
            f"{sorted(columns)}"
        )
    if len(wkb) == 0:
        raise DistrictsError(f"{path}: {where}: no feature: expected at least one district")
    if len(wkb) > MAX_DISTRICTS:
        raise DistrictsError(
            f"{path}: {where}: {len(wkb)} districts: expected at most {MAX_DISTRICTS}"
        )
    if crs_text_ is None:
        raise DistrictsError(
            f"{path}: {where}: no CRS declared: expected one (e.g. EPSG:4326 for "
            "longitude/latitude, EPSG:32615 for UTM metres), found none"
        )
    try:
        crs = CRS.from_user_input(crs_text_)
    except CRSError as err:
        raise DistrictsError(f"{path}: {where}: a CRS pyproj cannot read: {err}") from None
    names = _names(path, where, name_field, columns[name_field])
    geometries = tuple(
        _geometry(path, f"{where}: district {name!r}", blob, crs)
        for name, blob in zip(names, wkb, strict=True)
    )
    _refuse_overlaps(path, where, names, geometries)
    return Districts(path, name_field, names, geometries, crs)


def _read_ogr(path: Path, layer: str | None) -> tuple[str, dict[str, list], list, str | None]:
    """(layer as messages name it, columns, WKB per feature, CRS as GDAL names it or None)."""
    import pyogrio
    import pyogrio.errors as gdal

    errors = (gdal.DataSourceError, gdal.DataLayerError, gdal.FeatureError, gdal.FieldError,
              gdal.GeometryError, gdal.CRSError)  # fmt: skip
    try:
        features = [str(name) for name, kind in pyogrio.list_layers(path) if kind is not None]
        if layer is None and len(features) != 1:
            raise DistrictsError(
                f"{path}: expected one feature layer (or a layer named), found {features}"
            )
        if layer is not None and layer not in features:
            raise DistrictsError(f"{path}: no layer {layer!r}: found feature layers {features}")
        name = layer or features[0]
        meta, table = pyogrio.read_arrow(path, layer=name)
    except errors as err:
        first = str(err).split(";")[0].strip()
        raise DistrictsError(f"{path}: GDAL cannot read it: {first}") from None
    column = meta["geometry_name"] or "wkb_geometry"
    wkb = table.column(column).to_pylist()
    columns = {c: table.column(c).to_pylist() for c in table.column_names if c != column}
    return f"layer {name!r}", columns, wkb, meta["crs"]


def _read_parquet(path: Path, layer: str | None) -> tuple[str, dict[str, list], list, str | None]:
    """GeoParquet: its primary geometry column in WKB; a column without ``crs`` is OGC:CRS84
    (the specification's default), ``crs: null`` is an undeclared CRS."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        meta = json.loads((table.schema.metadata or {}).get(b"geo", b"null") or "null")
    except (OSError, ValueError) as err:
        raise DistrictsError(f"{path}: cannot read it as GeoParquet: {err}") from None
    if not isinstance(meta, dict):
        raise DistrictsError(f"{path}: no GeoParquet 'geo' metadata: expected a GeoParquet file")
    column = meta.get("primary_column", "geometry")
    info = meta.get("columns", {}).get(column, {})
    if column not in table.column_names or info.get("encoding", "WKB").upper() != "WKB":
        raise DistrictsError(
            f"{path}: geometry column {column!r}: expected it in WKB, found "
            f"{info.get('encoding') if column in table.column_names else 'no such column'}"
        )
    crs = json.dumps(info["crs"]) if info.get("crs") else None
    if "crs" not in info:
        crs = "OGC:CRS84"
    wkb = table.column(column).to_pylist()
    columns = {c: table.column(c).to_pylist() for c in table.column_names if c != column}
    return f"column {column!r}", columns, wkb, crs


def _names(path: Path, where: str, field: str, values: list) -> tuple[str, ...]:
    names, seen = [], {}
    for i, value in enumerate(values, start=1):
        name = "" if value is None else str(value).strip()
        if not name:
            raise DistrictsError(
                f"{path}: {where}: feature {i}: field {field!r}: expected a district name, "
                f"found {value!r}"
            )
        if name.lower() == OUTSIDE:
            raise DistrictsError(
                f"{path}: {where}: feature {i}: field {field!r}: {name!r} names the pixels in "
                "no district: expected another name"
            )
        if name in seen:
            raise DistrictsError(
                f"{path}: {where}: field {field!r}: district {name!r} named twice (features "
                f"{seen[name]} and {i}): expected unique names"
            )
        seen[name] = i
        names.append(name)
    return tuple(names)


def _geometry(path: Path, where: str, blob: bytes | None, crs: CRS) -> BaseGeometry:
    try:
        geometry = shapely.from_wkb(blob) if blob is not None else None
    except shapely.errors.ShapelyError as err:
        raise DistrictsError(f"{path}: {where}: cannot read its geometry: {err}") from None
    if geometry is None or geometry.is_empty:
        raise DistrictsError(f"{path}: {where}: expected a polygon, found no geometry")
    if geometry.geom_type not in POLYGONS:
        raise DistrictsError(
            f"{path}: {where}: expected a Polygon or MultiPolygon, found a {geometry.geom_type}"
        )
    geometry = shapely.force_2d(geometry)
    if not geometry.is_valid:
        # Refused, not repaired: which ground a self-crossing ring meant is the user's to say.
        raise DistrictsError(
            f"{path}: {where}: an invalid polygon: {shapely.is_valid_reason(geometry)} "
            f"(coordinates in {crs.to_string()}): expected rings that do not cross themselves"
        )
    return geometry


def _refuse_overlaps(
    path: Path, where: str, names: tuple[str, ...], geometries: tuple[BaseGeometry, ...]
) -> None:
    """Refuse two districts sharing more than ``SLIVER`` of the smaller one's area, in the
    file's own CRS (where a shared edge is one line, so it overlaps by nothing)."""
    tree = shapely.STRtree(geometries)
    left, right = tree.query(geometries, predicate="intersects")
    for i, j in zip(left.tolist(), right.tolist(), strict=True):
        if i >= j:
            continue
        a, b = geometries[i], geometries[j]
        shared = shapely.intersection(a, b).area
        if shared > SLIVER * min(a.area, b.area):
            raise DistrictsError(
                f"{path}: {where}: districts {names[i]!r} and {names[j]!r} overlap "
                f"({shared / min(a.area, b.area):.2%} of the smaller): expected districts "
                "that share at most their edges (a pixel belongs to one district)"
            )


def step_of(crs: CRS) -> float:
    """The longest edge piece, in ``crs`` units, before reprojection: ``geo.DENSIFY_DEG`` in
    degrees (about 1 km), else ``STEP_M`` metres in the CRS's linear unit."""
    if crs.is_geographic:
        return geo.DENSIFY_DEG
    metres = crs.axis_info[0].unit_conversion_factor if crs.axis_info else 1.0
    return STEP_M / (metres or 1.0)


def on_map(districts: Districts, map_crs: CRS | rasterio.crs.CRS | str) -> MapDistricts:
    """The districts in a map's CRS: reprojected once (edges cut into pieces of at most
    :func:`step_of` first), or as they are where the CRS is the same."""
    crs = CRS.from_user_input(map_crs.to_wkt() if hasattr(map_crs, "to_wkt") else map_crs)
    if crs == districts.crs:
        moved = districts.geometries
    else:
        step = step_of(districts.crs)
        moved = tuple(geo.reproject(g, districts.crs, crs, step=step) for g in districts.geometries)
    bounds = np.array([g.bounds for g in moved], np.float64).reshape(-1, 4)
    return MapDistricts(crs, moved, bounds)


def on_map_once(
    districts: Districts, crs: rasterio.crs.CRS, placed: dict[str, MapDistricts]
) -> MapDistricts:
    """:func:`on_map` once per CRS over many maps (kept in ``placed`` by the CRS's text): a
    thousand regions in one UTM zone move the districts once."""
    text = crs_text(crs)
    shapes = placed[text] = placed.get(text) or on_map(districts, text)
    return shapes


def window_bounds(transform: Affine, window: Window) -> tuple[float, float, float, float]:
    """(xmin, ymin, xmax, ymax) of a window on any affine grid (a bottom-up map's rasterio
    bounds have bottom > top)."""
    col0, row0 = float(window.col_off), float(window.row_off)
    cols = (col0, col0 + window.width, col0, col0 + window.width)
    rows = (row0, row0, row0 + window.height, row0 + window.height)
    xs, ys = transform * (np.array(cols), np.array(rows))
    return float(xs.min()), float(ys.min()), float(xs.max()), float(ys.max())


def district_ids(shapes: MapDistricts, transform: Affine, window: Window) -> np.ndarray:
    """(h, w) uint16: the district holding each pixel centre of ``window`` on a map with
    ``transform`` (``shapes`` in the map's CRS, :func:`on_map`), 0 where none does. The
    first district in the file wins a centre two claim (burned last)."""
    local, ids = district_burn(shapes, transform, window)
    return ids.astype(np.uint16)[local]


def district_burn(
    shapes: MapDistricts, transform: Affine, window: Window
) -> tuple[np.ndarray, np.ndarray]:
    """(local, ids): (h, w) uint8 (uint16 past 255 districts near) each pixel centre's
    district as an index into ``ids`` (0 none), and (L + 1,) int64 the districts near
    ``window`` (``ids[0]`` = 0, the outside): :func:`district_ids` is ``ids[local]``. A
    caller that counts per district counts per local index (L + 1 values, a handful, not
    D + 1) and adds into ``ids`` once per window.
    Each polygon is cut to the window (one pixel wider on each side) before the burn: GDAL's
    scanline burn tests every edge on every row, and a county's thousands of vertices would
    cost more than the pixels; inside the window the edges, so the pixels burned, are the
    same. A window one district holds whole, no other touching it (:func:`_held_whole`), is
    filled, neither cut nor burned; one that only the cut shows to be so, filled too."""
    height, width = int(window.height), int(window.width)
    xmin, ymin, xmax, ymax = window_bounds(transform, window)
    b = shapes.bounds
    near = np.flatnonzero((b[:, 0] <= xmax) & (b[:, 2] >= xmin) & (b[:, 1] <= ymax)
                          & (b[:, 3] >= ymin))  # fmt: skip
    if near.size == 0 or height == 0 or width == 0:
        return np.zeros((height, width), np.uint8), np.zeros(1, np.int64)
    pad = window_bounds(transform, Window(window.col_off - 1, window.row_off - 1, width + 2,
                                          height + 2))  # fmt: skip
    ids = np.concatenate([[OUTSIDE_ID], near + 1]).astype(np.int64)
    whole = _held_whole(shapes, near, shapely.box(*pad))
    if whole:  # one district holds the window, no other touches it: no cut, no burn
        return np.full((height, width), whole, np.uint8 if len(ids) <= 256 else np.uint16), ids
    # first district last: it wins a centre two claim
    burns = [(_cut(shapes.geometries[d], b[d], pad), i + 1) for i, d in enumerate(near)][::-1]
    burns = [(g, i) for g, i in burns if not g.is_empty]
    # local ids in uint8 while they fit: GDAL burns a byte raster faster
    local = np.zeros((height, width), np.uint8 if len(ids) <= 256 else np.uint16)
    if len(burns) == 1 and burns[0][0].area >= shapely.box(*pad).area:
        local.fill(burns[0][1])  # one district holds the whole window (and a pixel beyond)
    elif burns:
        rasterize([(_mapping(g), i) for g, i in burns], out=local, all_touched=False,
                  transform=window_transform(window, transform))  # fmt: skip
    return local, ids


def _held_whole(shapes: MapDistricts, near: np.ndarray, box: BaseGeometry) -> int:
    """The local index (1..L, :func:`district_burn`'s) of the district among ``near`` that
    covers ``box`` where no other of them touches it (a neighbour's sliver of overlap would
    claim centres: then the window is burned), else 0. Prepared polygons (once each) answer
    without walking a county's vertices, where cutting them to the window would."""
    polygons = np.array([shapes.geometries[d] for d in near.tolist()], dtype=object)
    shapely.prepare(polygons)
    covering = np.flatnonzero(shapely.covers(polygons, box))
    if covering.size != 1 or shapely.intersects(np.delete(polygons, covering), box).any():
        return 0
    return int(covering[0]) + 1


def _mapping(geometry: BaseGeometry) -> dict:
    """A (multi)polygon as the GeoJSON-like mapping rasterize reads, its rings' coordinates as
    lists in one call each (shapely's ``__geo_interface__`` walks every coordinate in Python:
    a third of a burn's time over a county's vertices); the same coordinates, the same burn."""
    polygons = [
        [shapely.get_coordinates(ring).tolist() for ring in (p.exterior, *p.interiors)]
        for p in shapely.get_parts(geometry)
    ]
    if geometry.geom_type == "Polygon":
        return {"type": "Polygon", "coordinates": polygons[0]}
    return {"type": "MultiPolygon", "coordinates": polygons}


def _cut(geometry: BaseGeometry, bounds: np.ndarray, box: tuple[float, ...]) -> BaseGeometry:
    """``geometry`` cut to ``box`` where it reaches beyond it, its polygons only (a cut may
    leave a line or a point where the polygon touches the box: no pixel centre of the window
    lies there)."""
    if bounds[0] >= box[0] and bounds[1] >= box[1] and bounds[2] <= box[2] and bounds[3] <= box[3]:
        return geometry
    cut = shapely.clip_by_rect(geometry, *box)
    if cut.geom_type in POLYGONS:
        return cut
    parts = [g for g in shapely.get_parts(cut) if g.geom_type in POLYGONS]
    return shapely.MultiPolygon([q for g in parts for q in shapely.get_parts(g)])


def district_strips(
    src: rasterio.DatasetReader, shapes: MapDistricts, window: Window | None = None
) -> Iterator[tuple[Window, np.ndarray]]:
    """(strip, district ids of its pixels) over ``window`` (default: the map), the strips of
    :func:`emb.estimation.population.strips` (their scan order, their memory)."""
    for win in strips(src, window):
        yield win, district_ids(shapes, src.transform, win)


def district_counts(path: Path | str, districts: Districts) -> np.ndarray:
    """(D + 1, 256) int64 pixels per domain (row 0 the outside, row i district i) and map
    value, the map at ``path`` streamed by strips; values that are neither an L3 id nor
    nodata are refused as :func:`emb.estimation.population.count_l3` refuses them."""
    n = len(districts.names) + 1
    counts = np.zeros(n * 256, np.int64)
    with streaming(path) as src:
        if src.crs is None:
            raise MapCrsError(f"{path}: no CRS: the districts cannot be placed on the map")
        shapes = on_map(districts, crs_text(src.crs))
        for win, ids in district_strips(src, shapes):
            keys = ids.ravel().astype(np.int32) << 8 | src.read(1, window=win).ravel()
            for start in range(0, keys.size, CHUNK):  # bincount copies its input as int64
                counts += np.bincount(keys[start : start + CHUNK], minlength=n * 256)
    counts = counts.reshape(n, 256)
    foreign = np.flatnonzero(counts[:, N_L3:IGNORE].sum(0)) + N_L3
    if foreign.size:
        raise MapFileError(
            f"{path}: values {foreign.tolist()} are neither L3 class ids (0..{N_L3 - 1}) nor "
            f"nodata {IGNORE}"
        )
    return counts


def load_districts(
    source: str, file: str | Path | None, name_field: str, maps: Mapping[str, Path | str]
) -> Districts | None:
    """The districts of ``source`` (:data:`SOURCES`): ``file`` named by ``name_field``
    (None without one), the areas of the areas file ``file``, or the footprints of ``maps``
    (region -> its map)."""
    if source == "areas":
        return districts_of_areas(file)
    if source == "regions":
        return districts_of_maps(maps)
    if source != "file":
        raise DistrictsError(f"districts.source: expected one of {SOURCES}, found {source!r}")
    return read_districts(file, name_field) if file else None


def districts_of_areas(path: str | Path) -> Districts:
    """One district per area of the areas file at ``path`` (its polygons over every year
    joined), named by its ``area``, in WGS84 degrees, in the file's order of first mention;
    areas that overlap are refused as a districts file's are."""
    try:
        areas = read_areas(path)
    except AreasError as err:
        raise DistrictsError(f"districts from the areas file: {err}") from None
    parts: dict[str, list[BaseGeometry]] = {}
    for area in areas:
        parts.setdefault(area.name, []).append(area.geometry)
    names = tuple(parts)
    geometries = tuple(shapely.make_valid(shapely.union_all(g)) if len(g) > 1 else g[0]
                       for g in parts.values())  # fmt: skip
    _refuse_overlaps(Path(path), f"field {AREA_FIELD!r}", names, geometries)
    return Districts(Path(path), AREA_FIELD, names, geometries, geo.WGS84)


def districts_of_maps(maps: Mapping[str, Path | str]) -> Districts:
    """One district per region of ``maps`` (region -> its map): the map's footprint, in the
    maps' CRS when all share one (no reprojection: every pixel centre lies inside its own map's
    footprint), else moved into WGS84 with its edges cut short first. Refused: a map without a
    CRS, and two regions whose maps overlap (a pixel would be counted in both)."""
    footprints, crss = {}, {}
    for region, path in maps.items():
        with rasterio.open(path) as src:
            if src.crs is None:
                raise DistrictsError(f"{path}: no CRS: region {region!r} cannot be a district")
            crss[region] = CRS.from_user_input(crs_text(src.crs))
            footprints[region] = shapely.box(*src.bounds)
    if not footprints:
        raise DistrictsError("districts from the regions: expected at least one map, found none")
    first = next(iter(crss.values()))
    crs = first if all(c == first for c in crss.values()) else geo.WGS84
    geometries = tuple(geo.reproject(footprints[r], crss[r], crs, step=step_of(crss[r]))
                       for r in footprints)  # fmt: skip
    folder = Path(next(iter(maps.values()))).parent
    try:
        _refuse_overlaps(folder, "the regions' maps", tuple(footprints), geometries)
    except DistrictsError as err:
        raise DistrictsError(
            f"{err}; regions whose maps overlap cannot be districts: name a districts file "
            "(area_estimates.districts.file) instead"
        ) from None
    return Districts(folder, REGION_FIELD, tuple(footprints), geometries, crs)

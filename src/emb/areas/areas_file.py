"""The areas file: ``area``, ``year``, ``split`` and a geometry in any CRS, as a GeoPackage,
GeoJSON, GeoParquet or a TSV of bounding boxes (``west south east north`` [``crs``]).

Every area comes back in WGS84 degrees. Errors name the file, the area and what was found.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import shapely
from pyproj import CRS
from pyproj.exceptions import CRSError
from shapely.geometry.base import BaseGeometry

from emb.areas import AreasError
from emb.geo import WGS84, read_gpkg, reproject
from emb.prep.regions import PREDICT

NAME = re.compile(r"^[a-z0-9_][a-z0-9_-]*$")  # as region ids (regions.schema.yaml)
SPLITS = ("auto", "train", "val", "test", PREDICT)
SUFFIXES = {
    ".gpkg": "gpkg",
    ".geojson": "geojson",
    ".json": "geojson",
    ".parquet": "parquet",
    ".geoparquet": "parquet",
    ".tsv": "tsv",
}


@dataclass(frozen=True)
class Area:
    """One area of one year, in WGS84 degrees (lon, lat)."""

    name: str
    year: int
    split: str
    geometry: BaseGeometry
    crs: str  # the CRS the file gave it in, for messages


def read_areas(path: str | Path) -> list[Area]:
    """Every area of the file, checked: names unique per year, years integers, splits known,
    polygons valid, in degrees where read as degrees, and not crossing the antimeridian."""
    path = Path(path)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise AreasError(
            f"{path}: areas file of an unknown format {path.suffix!r}: expected "
            f"{', '.join(sorted(SUFFIXES))}"
        )
    if not path.exists():
        raise AreasError(f"{path}: areas file not found")
    reader = {
        "gpkg": _read_gpkg,
        "geojson": _read_geojson,
        "parquet": _read_parquet,
        "tsv": _read_tsv,
    }[kind]
    try:
        records, crs = reader(path)
    except AreasError:
        raise
    except (
        ValueError,
        KeyError,
        OSError,
        CRSError,
        shapely.errors.ShapelyError,
    ) as err:
        raise AreasError(f"{path}: cannot read as a {kind} areas file: {err}") from None
    if not records:
        raise AreasError(f"{path}: no area: expected at least one feature with area and year")
    return _checked(path, records, crs)


def _checked(path: Path, records: list[dict], default_crs: CRS) -> list[Area]:
    areas, seen = [], set()
    for i, rec in enumerate(records, start=1):
        if "area" not in rec:
            found = sorted(k for k in rec if k != "geometry")
            raise AreasError(
                f"{path}: feature {i}: no 'area' property (it names the regions "
                f"{{area}}_{{zone}}): expected properties area, year [, split], found {found}"
            )
        name = str(rec.get("area") or "")
        where = f"{path}: area {name!r}"
        if not NAME.match(name):
            raise AreasError(
                f"{where}: expected a name of lowercase letters, digits, '_' and '-' (not "
                f"starting with '-'; it names the regions {name}_{{zone}}), found {name!r}"
            )
        try:
            year = int(str(rec.get("year")).strip())
        except ValueError:
            raise AreasError(
                f"{where}: year: expected an integer, found {rec.get('year')!r}"
            ) from None
        split = str(rec.get("split") or "auto").strip() or "auto"
        if split not in SPLITS:
            raise AreasError(f"{where}: split: expected one of {SPLITS}, found {split!r}")
        if (name, year) in seen:
            raise AreasError(f"{where}: listed twice for year {year}")
        seen.add((name, year))
        crs = rec.get("crs") or default_crs
        geometry = rec["geometry"]
        if geometry is not None and not geometry.is_empty and not geometry.is_valid:
            # Refused, not repaired: a self-intersecting ring has no one inside (a bow-tie's
            # lobes cancel), and which ground the user meant is theirs to say.
            raise AreasError(
                f"{where}: an invalid polygon: {shapely.is_valid_reason(geometry)} "
                f"(coordinates in {crs.to_string()}): expected rings that do not cross "
                "themselves; fix the polygon (e.g. split a bow-tie into two polygons)"
            )
        if geometry is None or geometry.is_empty or geometry.area == 0:
            raise AreasError(f"{where}: expected a polygon, found an empty or zero-area geometry")
        areas.append(Area(name, year, split, _to_wgs84(where, geometry, crs), crs.to_string()))
    return areas


def _to_wgs84(where: str, geometry: BaseGeometry, crs: CRS) -> BaseGeometry:
    if crs.is_geographic:
        _check_degrees(where, geometry, crs)
        _check_antimeridian(where, geometry, crs)
        geometry = reproject(geometry, crs, WGS84)
    else:
        west, south, east, north = geometry.bounds
        step = max(east - west, north - south) / 64 or None
        geometry = reproject(geometry, crs, WGS84, step=step)
        _check_antimeridian(where, geometry, crs)
    west, south, east, north = geometry.bounds
    if south < -80 or north > 84:
        raise AreasError(
            f"{where}: reaches latitude {south:.2f} to {north:.2f}: expected an area within "
            "the UTM latitudes -80 to 84 (the products are tiled in UTM zones)"
        )
    return geometry


def _check_degrees(where: str, geometry: BaseGeometry, crs: CRS) -> None:
    """Coordinates beyond any longitude or latitude in a file read as degrees are metres (or
    feet) of a projected CRS the file does not declare: say so, not "antimeridian"."""
    west, south, east, north = geometry.bounds
    if max(abs(west), abs(east)) <= 360 and max(abs(south), abs(north)) <= 90:
        return
    declared = crs.to_string()
    said = (
        "the file declares no CRS, or OGC:CRS84 (longitude/latitude: GeoJSON's default)"
        if declared == "OGC:CRS84"
        else f"the file declares {declared} (longitude/latitude)"
    )
    raise AreasError(
        f"{where}: coordinates x {west:.6g} to {east:.6g}, y {south:.6g} to {north:.6g} are "
        f"not longitude/latitude in degrees, but {said}: if they are metres, name their CRS "
        "in the file (a GeoJSON 'crs' member such as urn:ogc:def:crs:EPSG::32614, the "
        "GeoPackage's or GeoParquet's CRS) or reproject the areas to longitude/latitude"
    )


def _check_antimeridian(where: str, geometry: BaseGeometry, crs: CRS) -> None:
    west, _, east, _ = geometry.bounds
    if west < -180 or east > 180 or east - west > 180:
        raise AreasError(
            f"{where}: crosses the antimeridian (longitudes {west:.3f} to {east:.3f} in "
            f"{crs.to_string()}): split it into two areas, one each side of 180 degrees"
        )


def _read_gpkg(path: Path) -> tuple[list[dict], CRS]:
    """The first feature layer (by name), through GDAL; its declared CRS, never a guess."""
    layer = read_gpkg(path)
    if layer.crs is None:
        raise AreasError(
            f"{path}: layer {layer.name!r} declares no CRS: expected one (e.g. EPSG:4326 for "
            "longitude/latitude, EPSG:32615 for UTM metres), found none"
        )
    crs = CRS.from_user_input(layer.crs)
    records = layer.table.to_pylist()
    for i, (rec, blob) in enumerate(zip(records, layer.wkb, strict=True), start=1):
        try:
            rec["geometry"] = shapely.from_wkb(blob) if blob else None
        except shapely.errors.ShapelyError as err:
            where = f"layer {layer.name!r}: {_feature(i, rec)}"
            raise AreasError(f"{path}: {where}: cannot read its geometry: {err}") from None
    return records, crs


def _read_geojson(path: Path) -> tuple[list[dict], CRS]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    features = doc.get("features") if doc.get("type") == "FeatureCollection" else [doc]
    crs = _geojson_crs(path, doc.get("crs"))
    records = []
    for i, feature in enumerate(features, start=1):
        rec = dict(feature.get("properties") or {})
        geometry = feature.get("geometry")
        try:
            rec["geometry"] = shapely.from_geojson(json.dumps(geometry)) if geometry else None
        except shapely.errors.ShapelyError as err:
            raise AreasError(
                f"{path}: {_feature(i, rec)}: cannot read its geometry: {err}"
            ) from None
        records.append(rec)
    return records, crs


def _geojson_crs(path: Path, member: object) -> CRS:
    """RFC 7946's OGC:CRS84, or what a legacy (2008) ``crs`` member names: ``{"type": "name",
    "properties": {"name": ...}}`` or ``{"type": "EPSG", "properties": {"code": ...}}``. A
    member not understood is refused: reading its metres as degrees misplaces every area."""
    if not member:
        return CRS.from_user_input("OGC:CRS84")
    props = (member.get("properties") if isinstance(member, dict) else None) or {}
    kind = str(member.get("type", "")).lower() if isinstance(member, dict) else ""
    if kind == "name" and props.get("name"):
        return CRS.from_user_input(props["name"])
    if kind == "epsg" and str(props.get("code", "")).isdigit():
        return CRS.from_epsg(int(props["code"]))
    raise AreasError(
        f"{path}: a 'crs' member this reader cannot use ({json.dumps(member)[:200]}): expected "
        '{"type": "name", "properties": {"name": "EPSG:32614"}} or none (longitude/latitude)'
    )


def _read_parquet(path: Path) -> tuple[list[dict], CRS]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = json.loads((table.schema.metadata or {}).get(b"geo", b"{}"))
    column = meta.get("primary_column", "geometry")
    if column not in table.column_names:
        raise AreasError(f"{path}: no geometry column {column!r} (GeoParquet 'geo' metadata)")
    info = meta.get("columns", {}).get(column, {})
    if info.get("encoding", "WKB").upper() != "WKB":
        raise AreasError(f"{path}: geometry encoding {info['encoding']!r}: expected WKB")
    crs = CRS.from_user_input(info["crs"]) if info.get("crs") else CRS.from_user_input("OGC:CRS84")
    frame = table.drop([column]).to_pandas()
    records = frame.to_dict("records")
    blobs = table.column(column).to_numpy(zero_copy_only=False)
    for i, (rec, blob) in enumerate(zip(records, blobs, strict=True), start=1):
        try:
            rec["geometry"] = shapely.from_wkb(blob)
        except shapely.errors.ShapelyError as err:
            where = _feature(i, rec)
            raise AreasError(f"{path}: {where}: cannot read its geometry: {err}") from None
    return records, crs


def _feature(i: int, rec: dict) -> str:
    """A feature as messages name it: its number in the file and its area, when it has one."""
    return f"feature {i} (area {rec['area']!r})" if "area" in rec else f"feature {i}"


BBOX = ("west", "south", "east", "north")


def _read_tsv(path: Path) -> tuple[list[dict], CRS]:
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    frame = pd.read_csv(io.StringIO(text), sep="\t", dtype=str, keep_default_na=False)
    missing = [c for c in ("area", "year", *BBOX) if c not in frame.columns]
    if missing:
        raise AreasError(
            f"{path}: expected tab-separated columns area, year, split, west, south, east, "
            f"north [, crs], found {list(frame.columns)} (missing {missing})"
        )
    records = []
    for rec in frame.to_dict("records"):
        try:
            west, south, east, north = (float(rec[c]) for c in BBOX)
        except ValueError:
            raise AreasError(
                f"{path}: area {rec['area']!r}: west/south/east/north: expected numbers, found "
                f"{[rec[c] for c in BBOX]}"
            ) from None
        if west > east and not (rec.get("crs") or "").strip():
            raise AreasError(
                f"{path}: area {rec['area']!r}: west {west} > east {east}: the box crosses the "
                "antimeridian: split it into two areas, one each side of 180 degrees"
            )
        if not (west < east and south < north):
            raise AreasError(
                f"{path}: area {rec['area']!r}: expected west < east and south < north, found "
                f"{west}, {south}, {east}, {north}"
            )
        rec["geometry"] = shapely.box(west, south, east, north)
        rec["crs"] = CRS.from_user_input(rec["crs"]) if rec.get("crs") else None
        records.append(rec)
    return records, WGS84

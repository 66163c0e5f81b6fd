"""A user's labelled reference sample, read and checked against its design record, and any
map's classes at its points.

The user fills the design CSV's ``reference`` column with a CDL code or a class name of the
design's level; the record (``sample.json``) gives the strata the sample was drawn from. What
comes out is what an estimator needs: per labelled unit its design stratum and reference
class, the strata sizes, and the units left unlabelled per stratum (counted, never dropped
from the strata silently). Every refusal is one line naming the file and the row.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import rasterio
from pyproj import CRS

from emb import geo
from emb.classes import IGNORE, ClassMap
from emb.evaluation.map_classes import (
    check_map,
    level_names,
    level_table,
    pixels_of,
    values_at,
)
from emb.evaluation.sample_design import MapRecord, Points, crs_text
from emb.io import reading
from emb.provenance import digest_file

RECORD_KEYS = ("level", "class_names", "maps", "strata", "n_drawn", "seed", "pixel_ha")
MAP_KEYS = ("region", "path", "sha256", "crs")
STRATUM_KEYS = ("class", "pixels", "allocated")
REQUIRED_COLUMNS = ("id", "region", "x", "y", "map_class", "reference")


class ReferenceSampleError(ValueError):
    """A labelled sample or its design record that cannot be estimated from as it is."""


@dataclass(frozen=True)
class DesignRecord:
    """A design's record as read back: ``strata_px`` (K,) int64 N_h, ``allocation`` (K,)
    int64 n_h over the K classes of ``level``; units carry ids 1..``n_drawn``."""

    path: Path
    level: int
    class_names: tuple[str, ...]
    maps: tuple[MapRecord, ...]
    strata_px: np.ndarray
    allocation: np.ndarray
    n_drawn: int
    seed: int
    pixel_ha: float


@dataclass(frozen=True)
class LabelledSample:
    """The labelled units of a sample, (m,) arrays: ``points`` where they lie, ``stratum``
    int64 the design stratum (map class at the design's level), ``reference`` int64 the
    reference class at that level. ``unlabelled_ids`` (u,) int64: rows with an empty
    reference; ``missing_ids``: design units absent from the CSV; ``unlabelled_per_stratum``
    (K,) int64 counts both. ``maps_checked``: regions whose map (the record's digest) the
    points were checked against; ``maps_unchecked``: region -> why not (missing, changed)."""

    csv_path: Path
    design: DesignRecord
    points: Points
    stratum: np.ndarray
    reference: np.ndarray
    unlabelled_ids: np.ndarray
    missing_ids: np.ndarray
    unlabelled_per_stratum: np.ndarray
    maps_checked: tuple[str, ...]
    maps_unchecked: dict[str, str]

    @property
    def unlabelled(self) -> int:
        """Design units without a reference label (empty, or the row removed)."""
        return int(self.unlabelled_per_stratum.sum())


def read_record(path: Path | str, cmap: ClassMap, sample: Path | str | None = None) -> DesignRecord:
    """The design record at ``path``, checked for its keys and for class names that are the
    config's at its level (else its stratum ids would name other classes)."""
    path = Path(path)
    about = f"{sample}: " if sample else ""
    if not path.is_file():
        raise ReferenceSampleError(
            f"{about}no design record at {path}: a sample is estimated only with the record "
            f"its design wrote beside it (sample.json)"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ReferenceSampleError(f"{path}: not a JSON design record ({err})") from err
    if not isinstance(data, dict):
        raise ReferenceSampleError(f"{path}: expected a JSON object, found {type(data).__name__}")
    _need(path, "the record", data, RECORD_KEYS)
    for i, entry in enumerate(data["maps"]):
        _need(path, f"maps[{i}]", entry, MAP_KEYS)
    for i, entry in enumerate(data["strata"]):
        _need(path, f"strata[{i}]", entry, STRATUM_KEYS)
    level = data["level"]
    try:
        names = level_names(level, cmap)
    except ValueError as err:
        raise ReferenceSampleError(f"{path}: key level: {err}") from err
    if tuple(data["class_names"]) != names:
        raise ReferenceSampleError(
            f"{path}: class_names of level {level} differ from the class table's "
            f"(expected {list(names)}, found {data['class_names']})"
        )
    classes = [s["class"] for s in data["strata"]]
    if classes != list(range(len(names))):
        raise ReferenceSampleError(
            f"{path}: strata must list classes 0..{len(names) - 1} in order, found {classes}"
        )
    maps = tuple(
        MapRecord(
            region=m["region"],
            path=m["path"],
            sha256=m["sha256"],
            crs=m["crs"],
            pixel_ha=float(m.get("pixel_ha", data["pixel_ha"])),
            width=int(m.get("width", 0)),
            height=int(m.get("height", 0)),
            pixels=int(m.get("pixels", 0)),
        )  # fmt: skip
        for m in data["maps"]
    )
    return DesignRecord(
        path=path, level=level, class_names=names, maps=maps,
        strata_px=np.array([s["pixels"] for s in data["strata"]], np.int64),
        allocation=np.array([s["allocated"] for s in data["strata"]], np.int64),
        n_drawn=int(data["n_drawn"]), seed=int(data["seed"]), pixel_ha=float(data["pixel_ha"]),
    )  # fmt: skip


def _need(path: Path, where: str, data: object, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise ReferenceSampleError(f"{path}: {where} lacks keys {missing} of a design record")


def reference_class(value: str, level: int, cmap: ClassMap) -> int | None:
    """The class id at ``level`` of a ``reference`` cell: a CDL code (integer) through the
    class table, or a class name of the level (any case); None when empty. Raises
    ``ValueError`` (without the file: the caller names it) for an unknown code or name."""
    text = value.strip()
    if not text:
        return None
    code = _integer(text)
    if code is not None:
        l3 = int(cmap.l3_of(np.array([code]))[0])
        if l3 == IGNORE:
            raise ValueError(f"reference {text!r} is no CDL code of the class table")
        return int(level_table(level, cmap)[l3])
    names = level_names(level, cmap)
    by_name = {name.lower(): i for i, name in enumerate(names)}
    key = text.lower()
    if key not in by_name:
        raise ValueError(
            f"reference {text!r} is neither a CDL code nor a class name of level {level} "
            f"({', '.join(names)})"
        )
    return by_name[key]


def _integer(text: str) -> int | None:
    """``text`` as an integer ("5", "5.0" as a spreadsheet may save it), else None."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


@dataclass
class _Rows:
    """The CSV's rows as parsed, before they are split into labelled and unlabelled."""

    lines: list[int]
    ids: list[int]
    region: list[str]
    x: list[float]
    y: list[float]
    stratum: list[int]
    reference: list[int | None]


def _read_rows(csv_path: Path, record: DesignRecord, cmap: ClassMap) -> _Rows:
    """Every row parsed and checked on its own (ids, region, numbers, classes, reference)."""
    try:
        text = csv_path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as err:
        raise ReferenceSampleError(f"{csv_path}: no such labelled sample") from err
    lines = csv.reader(text.splitlines())
    header = [h.strip() for h in next(lines, [])]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ReferenceSampleError(
            f"{csv_path}: line 1: missing columns {missing}; expected the design's columns "
            f"{list(REQUIRED_COLUMNS)} (and others)"
        )
    col = {name: header.index(name) for name in REQUIRED_COLUMNS}
    regions = {m.region for m in record.maps}
    n_classes = len(record.class_names)
    rows = _Rows([], [], [], [], [], [], [])
    first_line: dict[int, int] = {}
    for line, fields in enumerate(lines, start=2):
        if not any(f.strip() for f in fields):
            continue
        if len(fields) != len(header):
            _refuse(csv_path, line, f"{len(fields)} fields, the header has {len(header)}")
        cell = {name: fields[i].strip() for name, i in col.items()}
        if not cell["id"]:
            _refuse(csv_path, line, "empty id")
        unit = _integer(cell["id"])
        if unit is None or not 1 <= unit <= record.n_drawn:
            _refuse(
                csv_path, line, f"id {cell['id']!r} is none of the design's 1..{record.n_drawn}"
            )
        if unit in first_line:
            _refuse(csv_path, line, f"id {unit} is also on line {first_line[unit]}")
        first_line[unit] = line
        where = f"id {unit}: "
        if cell["region"] not in regions:
            _refuse(
                csv_path, line, f"{where}region {cell['region']!r} is none of {sorted(regions)}"
            )
        try:
            x, y = float(cell["x"]), float(cell["y"])
        except ValueError:
            _refuse(
                csv_path, line, f"{where}x, y must be numbers, found {cell['x']!r}, {cell['y']!r}"
            )
        stratum = _integer(cell["map_class"])
        if stratum is None or not 0 <= stratum < n_classes:
            _refuse(
                csv_path, line,
                f"{where}map_class {cell['map_class']!r} is no class id 0..{n_classes - 1} of "
                f"level {record.level}",
            )  # fmt: skip
        try:
            reference = reference_class(cell["reference"], record.level, cmap)
        except ValueError as err:
            _refuse(csv_path, line, f"{where}{err}")
        rows.lines.append(line)
        rows.ids.append(unit)
        rows.region.append(cell["region"])
        rows.x.append(x)
        rows.y.append(y)
        rows.stratum.append(stratum)
        rows.reference.append(reference)
    return rows


def _refuse(csv_path: Path, line: int, why: str) -> NoReturn:
    raise ReferenceSampleError(f"{csv_path}: line {line}: {why}")


def _check_on_maps(
    csv_path: Path, record: DesignRecord, rows: _Rows, cmap: ClassMap
) -> tuple[tuple[str, ...], dict[str, str]]:
    """Check each point against its map where the map is the design's (its digest): inside,
    not on nodata, of the map class the row says. Returns (checked regions, unchecked: why)."""
    checked: list[str] = []
    unchecked: dict[str, str] = {}
    table = level_table(record.level, cmap)
    region = np.array(rows.region, dtype=object)
    for entry in record.maps:
        path = Path(entry.path)
        if not path.is_file():
            unchecked[entry.region] = f"map {path} not found"
            continue
        if digest_file(path) != entry.sha256:
            unchecked[entry.region] = f"map {path} changed since the design (another digest)"
            continue
        picked = np.flatnonzero(region == entry.region)
        with reading(path), rasterio.open(path) as src:
            check_map(src, path)
            x, y = np.array(rows.x)[picked], np.array(rows.y)[picked]
            r, c, inside = pixels_of(src, x, y)
            for i in picked[~inside][:1]:
                _refuse(csv_path, rows.lines[i], f"id {rows.ids[i]}: point ({rows.x[i]}, "
                        f"{rows.y[i]}) lies outside map {path}")  # fmt: skip
            found = table[values_at(src, r, c)]
        for i, value in zip(picked, found, strict=True):
            if value == IGNORE:
                _refuse(csv_path, rows.lines[i], f"id {rows.ids[i]}: point on nodata of map {path}")
            if value != rows.stratum[i]:
                _refuse(
                    csv_path, rows.lines[i],
                    f"id {rows.ids[i]}: map_class {rows.stratum[i]} but map {path} has class "
                    f"{value} there at level {record.level}",
                )  # fmt: skip
        checked.append(entry.region)
    return tuple(checked), unchecked


def read_labelled(csv_path: Path | str, design_path: Path | str, cmap: ClassMap) -> LabelledSample:
    """The labelled units of the sample at ``csv_path`` with the design of ``design_path``.
    Refuses (:class:`ReferenceSampleError`, one line naming the file and the row or stratum)
    a missing or incomplete record, a bad row, a point outside its map or on nodata, and a
    stratum with pixels and no labelled unit."""
    csv_path = Path(csv_path)
    record = read_record(design_path, cmap, sample=csv_path)
    rows = _read_rows(csv_path, record, cmap)
    checked, unchecked = _check_on_maps(csv_path, record, rows, cmap)
    k = len(record.class_names)
    stratum = np.array(rows.stratum, np.int64)
    per_stratum = np.bincount(stratum, minlength=k)
    over = np.flatnonzero(per_stratum > record.allocation)
    if over.size:
        h = int(over[0])
        raise ReferenceSampleError(
            f"{csv_path}: stratum {h} {record.class_names[h]!r} has {per_stratum[h]} rows, "
            f"the design allocated {record.allocation[h]} (a map_class changed?)"
        )
    labelled = np.array([r is not None for r in rows.reference], bool)
    reference = np.array([r for r in rows.reference if r is not None], np.int64)
    labelled_per = np.bincount(stratum[labelled], minlength=k)
    empty = np.flatnonzero((record.strata_px > 0) & (labelled_per == 0))
    if empty.size:
        h = int(empty[0])
        raise ReferenceSampleError(
            f"{csv_path}: stratum {h} {record.class_names[h]!r} ({record.strata_px[h]} "
            f"pixels, {record.allocation[h]} allocated) has no labelled unit: label at least "
            f"one of its rows"
        )
    ids = np.array(rows.ids, np.int64)
    crs_of = {m.region: m.crs for m in record.maps}
    region = np.array(rows.region, dtype=object)[labelled]
    points = Points(
        ids=ids[labelled], region=region, x=np.array(rows.x, np.float64)[labelled],
        y=np.array(rows.y, np.float64)[labelled],
        crs=np.array([crs_of[r] for r in region], dtype=object),
    )  # fmt: skip
    missing = np.setdiff1d(np.arange(1, record.n_drawn + 1), ids)
    return LabelledSample(
        csv_path=csv_path, design=record, points=points, stratum=stratum[labelled],
        reference=reference, unlabelled_ids=ids[~labelled], missing_ids=missing,
        unlabelled_per_stratum=record.allocation - labelled_per, maps_checked=checked,
        maps_unchecked=unchecked,
    )  # fmt: skip


def map_classes_at(
    points: Points, maps: dict[str, Path], level: int, cmap: ClassMap, no_data: int | None = None
) -> np.ndarray:
    """(m,) int64 the class at ``level`` of each point on ``maps`` (region -> map file; e.g.
    another run's maps of the same regions), points moved into a map's CRS where it differs.
    A point outside its map or on its nodata is refused naming the point's id and the map, or
    given the class ``no_data`` when one is (another source's map may lack data where the
    design's had it); a region without a map is refused."""
    table = level_table(level, cmap)
    out = np.empty(len(points.ids), np.int64)
    region = np.asarray(points.region, dtype=object)
    for name in dict.fromkeys(region.tolist()):
        picked = np.flatnonzero(region == name)
        if name not in maps:
            raise ReferenceSampleError(
                f"no map of region {name!r} (point id {points.ids[picked[0]]}); maps given for "
                f"{sorted(maps)}"
            )
        path = Path(maps[name])
        with reading(path), rasterio.open(path) as src:
            check_map(src, path)
            x, y = points.x[picked], points.y[picked]
            map_crs = crs_text(src.crs)
            for text in dict.fromkeys(np.asarray(points.crs, dtype=object)[picked].tolist()):
                if text != map_crs:
                    same = np.asarray(points.crs, dtype=object)[picked] == text
                    move = geo.transformer(
                        CRS.from_user_input(text), CRS.from_wkt(src.crs.to_wkt())
                    )
                    x, y = x.copy(), y.copy()
                    x[same], y[same] = move.transform(x[same], y[same])
            rows, cols, inside = pixels_of(src, x, y)
            if no_data is not None:
                found = np.full(len(picked), IGNORE, np.uint8)
                found[inside] = table[values_at(src, rows[inside], cols[inside])]
                out[picked] = np.where(found == IGNORE, no_data, found)
                continue
            if not inside.all():
                i = picked[np.flatnonzero(~inside)[0]]
                raise ReferenceSampleError(
                    f"{path}: point id {points.ids[i]} ({points.x[i]}, {points.y[i]}) lies "
                    f"outside the map"
                )
            found = table[values_at(src, rows, cols)]
        if (found == IGNORE).any():
            i = picked[np.flatnonzero(found == IGNORE)[0]]
            raise ReferenceSampleError(f"{path}: point id {points.ids[i]} lies on nodata")
        out[picked] = found
    return out

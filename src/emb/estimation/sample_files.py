"""The sample's files: the CSV to fill in and its GeoPackage, written from a drawn design
(with ``sample.json`` beside them, :mod:`emb.estimation.sample_record`), and the labelled CSV
read back and checked against its record.

The user fills the design CSV's ``reference`` column with a CDL code or a class name of the
design's level; the record (``sample.json``) gives the strata the sample was drawn from. What
comes out is what an estimator needs: per labelled unit its design stratum and reference
class, the strata sizes, and the units left unlabelled per stratum (counted, never dropped
from the strata silently). Every refusal is one line naming the file and the row.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, NoReturn

import numpy as np
import pyogrio.raw
import rasterio
import shapely

from emb import geo
from emb.classes import IGNORE, ClassMap
from emb.estimation.population import (
    Points,
    check_map,
    level_names,
    level_table,
    pixels_of,
    values_at,
)
from emb.estimation.sample_record import DISTRICT_COLUMN, SampleRecord, columns, read_record
from emb.io import atomic_path, reading
from emb.provenance import digest_file

if TYPE_CHECKING:  # the design's module brings numba's compiler: not for a workflow's parse
    from emb.estimation.design import Design

REQUIRED_COLUMNS = ("id", "region", "x", "y", "map_class", "reference")


LAYER = "sample"  # the GeoPackage's layer
WORKBOOK_MAGIC = (b"PK\x03\x04", b"\xd0\xcf\x11\xe0")  # .xlsx (a zip), .xls (OLE2)
OTHER_DELIMITERS = (";", "\t")  # Excel's "CSV" where "," is the decimal separator; text export
SAVE_AS = 'save it from the spreadsheet as "CSV UTF-8 (Comma delimited)"'


class ReferenceSampleError(ValueError):
    """A labelled sample that cannot be estimated from as it is."""


@dataclass(frozen=True)
class SamplePaths:
    """The three files of a sample: the CSV to fill in, the GeoPackage, the JSON record."""

    csv: Path
    gpkg: Path
    record: Path

    @classmethod
    def in_folder(cls, folder: Path | str) -> SamplePaths:
        folder = Path(folder)
        return cls(folder / "sample.csv", folder / "sample.gpkg", folder / "sample.json")


def _district_names(design: Design) -> np.ndarray | None:
    """(m,) object: each unit's district name (``outside`` for district 0); None in a design
    without districts."""
    districts = design.record.districts
    if districts is None:
        return None
    return np.array(districts.names_by_id(), object)[design.district]


def _rows(design: Design) -> list[list]:
    p = design.points
    rows = [
        [int(i), str(r), float(x), float(y), str(c), float(lo), float(la), int(k),
         design.record.class_names[k], ""]
        for i, r, x, y, c, lo, la, k in zip(p.ids, p.region, p.x, p.y, p.crs, design.lon,
                                             design.lat, design.map_class, strict=True)
    ]  # fmt: skip
    names = _district_names(design)
    if names is not None:
        at = columns(False).index("region") + 1
        rows = [[*row[:at], str(name), *row[at:]] for row, name in zip(rows, names, strict=True)]
    return rows


def _write_csv(design: Design, path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns(design.record.districts is not None))
        writer.writerows(_rows(design))


def _write_gpkg(design: Design, path: Path) -> None:
    """The points as a GeoPackage layer ``sample``: WGS84 points, the CSV's fields."""
    p = design.points
    fields = list(columns(design.record.districts is not None))
    data = [
        p.ids, p.region.astype(object), p.x, p.y, p.crs.astype(object), design.lon, design.lat,
        design.map_class,
        np.array([design.record.class_names[k] for k in design.map_class], object),
        np.full(len(p.ids), "", object),
    ]  # fmt: skip
    names = _district_names(design)
    if names is not None:
        data.insert(fields.index(DISTRICT_COLUMN), names)
    geometry = shapely.to_wkb(shapely.points(design.lon, design.lat))
    named = path.with_name(path.name + ".gpkg")  # GDAL wants the extension on the file it makes
    try:
        pyogrio.raw.write(
            str(named), geometry, data, fields, layer=LAYER, driver="GPKG",
            geometry_type="Point", crs=geo.WGS84.to_wkt(),
        )  # fmt: skip
        os.replace(named, path)
    finally:
        named.unlink(missing_ok=True)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def write_sample(design: Design, out: SamplePaths | Path | str) -> SamplePaths:
    """Write the CSV, the GeoPackage and the JSON record (``out``: the three paths, or a
    folder for ``sample.csv``, ``sample.gpkg``, ``sample.json``). Each file appears whole or
    not at all; on a failure the files this call already put in place are taken back (so no
    new file stands beside an earlier design's), and an earlier design's files it did not
    replace are left as they were (a good output is never deleted)."""
    paths = out if isinstance(out, SamplePaths) else SamplePaths.in_folder(out)
    finals = (paths.csv, paths.gpkg, paths.record)
    before = {final: _identity(final) for final in finals}
    try:
        with contextlib.ExitStack() as stack:
            csv_tmp, gpkg_tmp, record_tmp = (stack.enter_context(atomic_path(f)) for f in finals)
            _write_csv(design, csv_tmp)
            _write_gpkg(design, gpkg_tmp)
            record_tmp.write_text(design.record.text())
    except BaseException:
        for final in finals:  # renamed into place before another's rename failed
            if final.is_file() and _identity(final) != before[final]:
                with contextlib.suppress(OSError):
                    final.unlink()
        raise
    return paths


@dataclass(frozen=True)
class LabelledSample:
    """The labelled units of a sample, (m,) arrays: ``points`` where they lie, ``stratum``
    int64 the design stratum (the map class at the design's level; in a design over districts
    ``district * K + class``, :attr:`map_class` the class), ``district`` int64 the unit's
    district as its row names it (0 the outside; all 0 without districts), ``reference``
    int64 the reference class at that level. ``unlabelled_ids`` (u,) int64: rows with an
    empty reference; ``missing_ids``: design units absent from the CSV;
    ``unlabelled_per_stratum`` (H,) int64 counts both. ``maps_checked``: regions whose map
    (the record's digest) the points were checked against; ``maps_unchecked``: region -> why
    not (missing, changed)."""

    csv_path: Path
    record: SampleRecord
    points: Points
    stratum: np.ndarray
    reference: np.ndarray
    unlabelled_ids: np.ndarray
    missing_ids: np.ndarray
    unlabelled_per_stratum: np.ndarray
    maps_checked: tuple[str, ...]
    maps_unchecked: dict[str, str]
    district: np.ndarray | None = None  # None: all 0 (built before districts)

    @property
    def map_class(self) -> np.ndarray:
        """(m,) int64 each labelled unit's map class at the design's level."""
        return self.stratum % len(self.record.class_names)

    @property
    def unit_district(self) -> np.ndarray:
        """(m,) int64 each labelled unit's district (0 the outside, and in a design without
        districts)."""
        if self.district is None:
            return np.zeros(len(self.stratum), np.int64)
        return np.asarray(self.district, np.int64)

    @property
    def unlabelled(self) -> int:
        """Design units without a reference label (empty, or the row removed)."""
        return int(self.unlabelled_per_stratum.sum())


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


class _ParsedRow(NamedTuple):
    """One row of the CSV as parsed: ``line`` its first physical line."""

    line: int
    id: int
    region: str
    x: float
    y: float
    stratum: int
    reference: int | None
    district: int


@dataclass
class _Rows:
    """The CSV's rows as parsed (one list per column of :class:`_ParsedRow`), before they are
    split into labelled and unlabelled."""

    lines: list[int]
    ids: list[int]
    region: list[str]
    x: list[float]
    y: list[float]
    stratum: list[int]
    reference: list[int | None]
    district: list[int]


def _text(csv_path: Path) -> str:
    """The file's text. A workbook renamed .csv, or a CSV saved in a legacy code page (Excel's
    plain "CSV" outside the US), is refused by name, not as a UnicodeDecodeError."""
    try:
        data = csv_path.read_bytes()
    except FileNotFoundError as err:
        raise ReferenceSampleError(f"{csv_path}: no such labelled sample") from err
    if data.startswith(WORKBOOK_MAGIC):
        raise ReferenceSampleError(
            f"{csv_path}: a spreadsheet workbook, not a CSV: expected comma-separated text; "
            f"{SAVE_AS}"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ReferenceSampleError(
            f"{csv_path}: line {line}: not UTF-8 text (byte 0x{data[err.start]:02x}); {SAVE_AS}"
        ) from None


def _required(record: SampleRecord) -> tuple[str, ...]:
    """The columns a labelled CSV must hold: ``district`` too in a design over districts (a
    design without them reads the CSVs of earlier samples, which have none)."""
    return REQUIRED_COLUMNS + ((DISTRICT_COLUMN,) if record.districts is not None else ())


def _header(csv_path: Path, header: list[str], text: str, required: tuple[str, ...]) -> list[str]:
    """The header's names, refused when a required column is missing; a header that holds
    them all split by another delimiter (Excel's export where the decimal separator is a
    comma) is refused as that, naming both delimiters: read as it is, its x, y would carry
    decimal commas."""
    names = [h.strip() for h in header]
    missing = [c for c in required if c not in names]
    if not missing:
        return names
    first = text.split("\n", 1)[0]
    for found in OTHER_DELIMITERS:
        if set(required) <= {h.strip() for h in first.split(found)}:
            raise ReferenceSampleError(
                f"{csv_path}: line 1: columns separated by {found!r}, expected ','; {SAVE_AS}"
            )
    raise ReferenceSampleError(
        f"{csv_path}: line 1: missing columns {missing}; expected the design's columns "
        f"{list(required)} (and others)"
    )


def _read_rows(csv_path: Path, record: SampleRecord, cmap: ClassMap) -> _Rows:
    """Every row parsed and checked on its own (:func:`_row`) and for an id given twice. A
    row's line is its first physical line: the reader counts them, so a quoted cell holding a
    line break does not shift the lines named after it."""
    text = _text(csv_path)
    reader = csv.reader(io.StringIO(text, newline=""))
    required = _required(record)
    header = _header(csv_path, next(reader, []), text, required)
    col = {name: header.index(name) for name in required}
    parsed: list[_ParsedRow] = []
    first_line: dict[int, int] = {}
    start = reader.line_num + 1
    try:
        for fields in reader:
            line, start = start, reader.line_num + 1
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != len(header):
                _refuse(csv_path, line, f"{len(fields)} fields, the header has {len(header)}")
            row = _row(csv_path, line, {n: fields[i].strip() for n, i in col.items()}, record,
                       cmap)  # fmt: skip
            if row.id in first_line:
                _refuse(csv_path, line, f"id {row.id} is also on line {first_line[row.id]}")
            first_line[row.id] = line
            parsed.append(row)
    except csv.Error as err:
        _refuse(csv_path, reader.line_num, f"not CSV ({err})")
    columns = list(zip(*parsed, strict=True)) or [()] * len(_ParsedRow._fields)
    return _Rows(*(list(column) for column in columns))


def _row(
    csv_path: Path, line: int, cell: dict[str, str], record: SampleRecord, cmap: ClassMap
) -> _ParsedRow:
    """One row's cells checked against the record: an id of the design, one of its regions,
    numbers x, y, a class id of its level, a reference code or name (or none)."""
    if not cell["id"]:
        _refuse(csv_path, line, "empty id")
    unit = _integer(cell["id"])
    if unit is None or not 1 <= unit <= record.n_drawn:
        _refuse(csv_path, line, f"id {cell['id']!r} is none of the design's 1..{record.n_drawn}")
    where = f"id {unit}: "
    regions = sorted(m.region for m in record.maps)
    if cell["region"] not in regions:
        _refuse(csv_path, line, f"{where}region {cell['region']!r} is none of {regions}")
    try:
        x, y = float(cell["x"]), float(cell["y"])
    except ValueError:
        _refuse(csv_path, line, f"{where}x, y must be numbers, found {cell['x']!r}, {cell['y']!r}")
    stratum, n_classes = _integer(cell["map_class"]), len(record.class_names)
    if stratum is None or not 0 <= stratum < n_classes:
        _refuse(
            csv_path, line,
            f"{where}map_class {cell['map_class']!r} is no class id 0..{n_classes - 1} of "
            f"level {record.level}",
        )  # fmt: skip
    district = 0
    if record.districts is not None:
        names = record.districts.names_by_id()
        if cell[DISTRICT_COLUMN] not in names:
            _refuse(csv_path, line, f"{where}district {cell[DISTRICT_COLUMN]!r} is none of the "
                    f"design's districts {list(names)}")  # fmt: skip
        district = names.index(cell[DISTRICT_COLUMN])
    try:
        reference = reference_class(cell["reference"], record.level, cmap)
    except ValueError as err:
        _refuse(csv_path, line, f"{where}{err}")
    return _ParsedRow(line, unit, cell["region"], x, y, district * n_classes + stratum,
                      reference, district)  # fmt: skip


def _refuse(csv_path: Path, line: int, why: str) -> NoReturn:
    raise ReferenceSampleError(f"{csv_path}: line {line}: {why}")


def _check_on_maps(
    csv_path: Path, record: SampleRecord, rows: _Rows, cmap: ClassMap
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
            mapped = rows.stratum[i] % len(record.class_names)
            if value != mapped:
                _refuse(
                    csv_path, rows.lines[i],
                    f"id {rows.ids[i]}: map_class {mapped} but map {path} has class "
                    f"{value} there at level {record.level}",
                )  # fmt: skip
        checked.append(entry.region)
    return tuple(checked), unchecked


def check_labelled(csv_path: Path | str, design_path: Path | str, cmap: ClassMap) -> SampleRecord:
    """The record of the labelled sample at ``csv_path``, after every check of
    :func:`read_labelled` that needs no map: the record, each row, the strata's counts. The
    workflow runs it at parse time, so that a bad sample is refused before any job starts
    (a job that failed on it would have its good outputs deleted); the points' checks against
    the design's maps stay in the job, where the maps exist."""
    csv_path = Path(csv_path)
    record = read_record(design_path, cmap, sample=csv_path)
    _check_strata(csv_path, record, _read_rows(csv_path, record, cmap))
    return record


def _check_strata(csv_path: Path, record: SampleRecord, rows: _Rows) -> None:
    """Refuse a stratum with more rows than the design allocated, and one with pixels and no
    labelled unit (its area could not be estimated)."""
    size = len(record.strata_px)
    stratum = np.array(rows.stratum, np.int64)
    per_stratum = np.bincount(stratum, minlength=size)
    over = np.flatnonzero(per_stratum > record.allocation)
    changed = (
        "a map_class changed?" if record.districts is None else "a map_class or district changed?"
    )
    if over.size:
        h = int(over[0])
        raise ReferenceSampleError(
            f"{csv_path}: stratum {record.stratum_name(h)} has {per_stratum[h]} rows, "
            f"the design allocated {record.allocation[h]} ({changed})"
        )
    labelled = np.array([r is not None for r in rows.reference], bool)
    labelled_per = np.bincount(stratum[labelled], minlength=size)
    empty = np.flatnonzero((record.strata_px > 0) & (labelled_per == 0))
    if empty.size:
        h = int(empty[0])
        raise ReferenceSampleError(
            f"{csv_path}: stratum {record.stratum_name(h)} ({record.strata_px[h]} "
            f"pixels, {record.allocation[h]} allocated) has no labelled unit: label at least "
            f"one of its rows"
        )


def read_labelled(csv_path: Path | str, design_path: Path | str, cmap: ClassMap) -> LabelledSample:
    """The labelled units of the sample at ``csv_path`` with the design of ``design_path``.
    Refuses (:class:`ReferenceSampleError`, one line naming the file and the row or stratum)
    a missing or incomplete record, a bad row, a point outside its map or on nodata (the maps
    first: a map_class edited by hand is named by its row there), and a stratum with pixels
    and no labelled unit."""
    csv_path = Path(csv_path)
    record = read_record(design_path, cmap, sample=csv_path)
    rows = _read_rows(csv_path, record, cmap)
    checked, unchecked = _check_on_maps(csv_path, record, rows, cmap)
    _check_strata(csv_path, record, rows)
    stratum = np.array(rows.stratum, np.int64)
    labelled = np.array([r is not None for r in rows.reference], bool)
    reference = np.array([r for r in rows.reference if r is not None], np.int64)
    labelled_per = np.bincount(stratum[labelled], minlength=len(record.strata_px))
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
        csv_path=csv_path, record=record, points=points, stratum=stratum[labelled],
        reference=reference, unlabelled_ids=ids[~labelled], missing_ids=missing,
        unlabelled_per_stratum=record.allocation - labelled_per, maps_checked=checked,
        maps_unchecked=unchecked, district=np.array(rows.district, np.int64)[labelled],
    )  # fmt: skip

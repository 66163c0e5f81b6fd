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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import pyogrio.raw
import rasterio
import shapely

from emb import geo
from emb.classes import IGNORE, ClassMap
from emb.estimation.design import Design
from emb.estimation.population import (
    Points,
    check_map,
    level_names,
    level_table,
    pixels_of,
    values_at,
)
from emb.estimation.sample_record import COLUMNS, SampleRecord, read_record
from emb.io import atomic_path, reading
from emb.provenance import digest_file

REQUIRED_COLUMNS = ("id", "region", "x", "y", "map_class", "reference")


LAYER = "sample"  # the GeoPackage's layer


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


def _rows(design: Design) -> list[list]:
    p = design.points
    return [
        [int(i), str(r), float(x), float(y), str(c), float(lo), float(la), int(k),
         design.record.class_names[k], ""]
        for i, r, x, y, c, lo, la, k in zip(p.ids, p.region, p.x, p.y, p.crs, design.lon,
                                             design.lat, design.map_class, strict=True)
    ]  # fmt: skip


def _write_csv(design: Design, path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows(_rows(design))


def _write_gpkg(design: Design, path: Path) -> None:
    """The points as a GeoPackage layer ``sample``: WGS84 points, the CSV's fields."""
    p = design.points
    fields = list(COLUMNS)
    data = [
        p.ids, p.region.astype(object), p.x, p.y, p.crs.astype(object), design.lon, design.lat,
        design.map_class,
        np.array([design.record.class_names[k] for k in design.map_class], object),
        np.full(len(p.ids), "", object),
    ]  # fmt: skip
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
    int64 the design stratum (map class at the design's level), ``reference`` int64 the
    reference class at that level. ``unlabelled_ids`` (u,) int64: rows with an empty
    reference; ``missing_ids``: design units absent from the CSV; ``unlabelled_per_stratum``
    (K,) int64 counts both. ``maps_checked``: regions whose map (the record's digest) the
    points were checked against; ``maps_unchecked``: region -> why not (missing, changed)."""

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


def _read_rows(csv_path: Path, record: SampleRecord, cmap: ClassMap) -> _Rows:
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
        csv_path=csv_path, record=record, points=points, stratum=stratum[labelled],
        reference=reference, unlabelled_ids=ids[~labelled], missing_ids=missing,
        unlabelled_per_stratum=record.allocation - labelled_per, maps_checked=checked,
        maps_unchecked=unchecked,
    )  # fmt: skip

"""The input table ``regions.tsv``: parsing and the checks made before any job starts.

Every error names the table, the row (1-based, header excluded), the region and the column.
Files that the workflow itself generates (the demo region) are checked by their producer.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import pandas as pd
import rasterio
from affine import Affine
from rasterio.coords import BoundingBox
from rasterio.crs import CRS
from rasterio.errors import RasterioIOError
from rasterio.warp import transform_bounds
from rasterio.windows import Window, from_bounds

from emb.rasters import BANDS, SOURCES


class RegionsError(ValueError):
    """A row of ``regions.tsv`` that cannot be used."""


def read_regions(path: str | Path) -> pd.DataFrame:
    """The table as strings (empty cells -> ""), indexed by region, rows in file order."""
    # Comments are whole lines only: a '#' inside a cell is part of a path, not a comment.
    lines = Path(path).read_text(encoding="utf-8-sig").splitlines(keepends=True)
    text = "".join(line for line in lines if not line.lstrip().startswith("#"))
    if not text.strip():
        raise RegionsError(f"{path}: empty, expected a tab-separated header starting with region")
    table = pd.read_csv(io.StringIO(text), sep="\t", dtype=str, keep_default_na=False)
    if "region" not in table.columns:
        raise RegionsError(
            f"{path}: expected a tab-separated header with a 'region' column, found "
            f"{text.splitlines()[0][:120]!r}"
        )
    if table.empty:
        raise RegionsError(f"{path}: no region: expected at least one row under the header")
    return table.set_index("region", drop=False)


def _where(path: Path, row: int, region: str, column: str) -> str:
    return f"{path}: row {row} (region {region!r}), column {column!r}"


def _overlaps(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


# What each column's raster must hold: a float AEF would be cast to int8 in the shards.
DTYPES = {"aef": ("int8",), "tessera": ("float32", "float64"), "cdl": ("uint8", "uint16")}
LABEL_SAMPLE = 1024  # CDL pixels per side read (decimated) to find labels over an embedding


@dataclass(frozen=True)
class Raster:
    """What the checks learn from one cell's raster."""

    file: str
    crs: CRS
    bounds: BoundingBox
    transform: Affine
    shape: tuple[int, int]


def check_regions(table: pd.DataFrame, path: Path, generated: Iterable[str] = ()) -> dict[str, int]:
    """Raise :class:`RegionsError` for the first unusable cell; ``generated`` paths are skipped.
    Returns the pixel count of every raster checked (what sizes the jobs that read them).

    Checked once, before any job: ids unique; each raster readable with the bands, dtype and a
    projected, north-up georeferencing its column needs; no embedding raster (same file or same
    grid) listed for two regions, which would put the same pixels into two splits; CDL labels
    present over each embedding raster.
    """
    generated = set(generated)
    _check_unique_ids(table, path)
    seen: dict[tuple, str] = {}  # an embedding raster's file or grid -> where it was listed
    sizes: dict[str, int] = {}
    for row, (region, rec) in enumerate(table.iterrows(), start=1):
        if not any(rec.get(s, "") for s in SOURCES):
            raise RegionsError(
                f"{_where(path, row, region, 'aef')}: neither aef nor tessera is given"
            )
        opened: dict[str, Raster] = {}
        for column in (*SOURCES, "cdl"):
            file = rec.get(column, "")
            if not file or file in generated:
                continue
            where = _where(path, row, region, column)
            opened[column] = _open_checked(file, column, where)
            sizes[file] = opened[column].shape[0] * opened[column].shape[1]
            if column in SOURCES:
                _check_not_seen(opened[column], column, where, seen)
        if "cdl" in opened:
            for source in SOURCES:
                if source in opened:
                    where = _where(path, row, region, "cdl")
                    _check_labels_over(opened["cdl"], opened[source], where)
    return sizes


def _check_unique_ids(table: pd.DataFrame, path: Path) -> None:
    rows = [str(r) for r in table.index]
    for row, region in enumerate(rows, start=1):
        if not region or region.startswith("-"):  # '-h' would reach a command line as an option
            raise RegionsError(
                f"{_where(path, row, region, 'region')}: expected an id starting with a letter, "
                f"digit or '_', found {region!r}"
            )
        if rows.index(region) + 1 != row:
            raise RegionsError(
                f"{_where(path, row, region, 'region')}: duplicate region id, "
                f"already used in row {rows.index(region) + 1}"
            )


def _open_checked(file: str, column: str, where: str) -> Raster:
    """The raster's facts, after the checks that need only its header."""
    if not Path(file).exists():
        raise RegionsError(f"{where}: file not found: {file}")
    _check_vrt_sources(file, where)
    try:
        with rasterio.open(file) as src:
            count, dtype, crs, transform = src.count, src.dtypes[0], src.crs, src.transform
            raster = Raster(file, crs, src.bounds, transform, (src.height, src.width))
            src.read(1, window=Window(0, 0, 1, 1))  # the header alone may hide unreadable data
    except RasterioIOError as err:
        raise RegionsError(f"{where}: cannot read {file} as a raster ({err})") from err
    expected = BANDS.get(column, 1)
    if count != expected:
        raise RegionsError(f"{where}: {file} has {count} bands, expected {expected}")
    if dtype not in DTYPES[column]:
        raise RegionsError(f"{where}: {file} holds {dtype}, expected {' or '.join(DTYPES[column])}")
    if crs is None:
        raise RegionsError(f"{where}: {file} has no CRS")
    if column in SOURCES:
        _check_grid(raster, where)
    return raster


def _check_vrt_sources(file: str, where: str) -> None:
    """A VRT opens without its sources and fails only at the first read ("Read failed"):
    name the sources that are missing instead."""
    if not file.lower().endswith(".vrt"):
        return
    try:
        root = ElementTree.parse(file).getroot()
    except ElementTree.ParseError as err:
        raise RegionsError(f"{where}: {file} is not a readable VRT (XML: {err})") from None
    missing = []
    for source in root.iter("SourceFilename"):
        name = (source.text or "").strip()
        path = Path(file).parent / name if source.get("relativeToVRT") == "1" else Path(name)
        if name and not name.startswith("/vsi") and not path.exists():
            missing.append(str(path))
    if missing:
        raise RegionsError(
            f"{where}: {file} is a VRT whose source files do not exist: "
            f"{', '.join(sorted(set(missing))[:3])}{' ...' if len(set(missing)) > 3 else ''}"
        )


def _check_grid(raster: Raster, where: str) -> None:
    """Tiles and split blocks are cut in pixels and metres on a north-up grid."""
    t, file = raster.transform, raster.file
    if t.b != 0 or t.d != 0:
        raise RegionsError(
            f"{where}: {file} has a rotated or sheared geotransform (expected b = d = 0, found "
            f"b = {t.b}, d = {t.d}): warp it north-up (gdalwarp) first"
        )
    if t.is_identity:
        raise RegionsError(f"{where}: {file} has no geotransform (pixel coordinates only)")
    if raster.crs.is_geographic:
        unit = raster.crs.linear_units or "degree"
        raise RegionsError(
            f"{where}: {file} is in the geographic CRS {raster.crs.to_string()} (units: {unit}), "
            "but tiles and splits.block_m are measured in metres: expected a projected CRS; "
            "reproject it (e.g. to its UTM zone) first"
        )


def _check_not_seen(raster: Raster, source: str, where: str, seen: dict[tuple, str]) -> None:
    """The same embedding pixels under two regions would leak between one source's splits.
    An AEF and a TESSERA raster on one grid are fine: each source has its own shards."""
    grid = (raster.crs.to_string(), tuple(raster.transform), raster.shape)
    keys = [("file", source, os.path.realpath(raster.file)), ("grid", source, *grid)]
    for key in keys:
        if key in seen:
            what = "the same file" if key[0] == "file" else "a raster on the same grid"
            raise RegionsError(
                f"{where}: {raster.file} is {what} as {seen[key]}: the same pixels would be "
                "drawn into two regions' splits (train and val/test); list each raster once"
            )
        seen[key] = where


def _check_labels_over(cdl: Raster, emb: Raster, where: str) -> None:
    """The CDL must hold labels (non-zero codes) inside the embedding raster's extent."""
    try:
        inside = transform_bounds(emb.crs, cdl.crs, *emb.bounds, densify_pts=21)
    except Exception as err:  # noqa: BLE001 - PROJ fails in many ways on far-apart CRSs
        raise RegionsError(
            f"{where}: {cdl.file} cannot be compared with {emb.file}: {err}"
        ) from err
    if not _overlaps(inside, tuple(cdl.bounds)):
        raise RegionsError(
            f"{where}: {cdl.file} does not overlap the embedding raster {emb.file} (CDL bounds "
            f"{tuple(round(v) for v in cdl.bounds)}, embedding bounds in the CDL's CRS "
            f"{tuple(round(v) for v in inside)})"
        )
    with rasterio.open(cdl.file) as src:
        window = from_bounds(*inside, transform=src.transform).intersection(
            Window(0, 0, src.width, src.height)
        )
        h, w = max(1, round(window.height)), max(1, round(window.width))
        scale = max(h / LABEL_SAMPLE, w / LABEL_SAMPLE, 1.0)
        shape = (max(1, int(h / scale)), max(1, int(w / scale)))
        codes = src.read(1, window=window, out_shape=shape, boundless=False)
        nodata = src.nodata
    labelled = (codes != 0) & (codes != nodata if nodata is not None else True)
    if not labelled.any():
        raise RegionsError(
            f"{where}: {cdl.file} has no labelled pixel over the embedding raster {emb.file} "
            f"(expected non-zero CDL codes inside its extent, found {window.width:.0f} x "
            f"{window.height:.0f} CDL pixels there, all background or nodata)"
        )

"""The regions table's rows against their files, checked while the workflow parses, before any
job starts: ids, row kinds, each raster's bands, dtype, grid and year, one dataset version per
source, no raster or ground listed twice, labels under every embedding raster; and what the jobs
need from them (:class:`RegionChecks`: raster sizes, the split draw each region shares).

Every error names the table, the row (1-based, header excluded), the region and the column.
Files that the workflow itself generates (the demo region) are checked by their producer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Protocol
from xml.etree import ElementTree

import pandas as pd
import rasterio
from affine import Affine
from rasterio.coords import BoundingBox
from rasterio.crs import CRS
from rasterio.errors import RasterioIOError
from rasterio.io import DatasetReader
from rasterio.warp import transform_bounds
from rasterio.windows import Window, from_bounds

from emb import stage_runner
from emb.prep import tessera_npy
from emb.prep.footprints import (
    Footprint,
    FootprintError,
    ground_groups,
    ground_metre_problem,
    group_extent,
)
from emb.prep.regions import PREDICT, RegionsError, is_predict_only
from emb.rasters import (
    BANDS,
    DTYPES,
    SOURCES,
    YEAR_TAGS,
    product_tags,
)
from emb.workflow.forked_reads import in_order


def shown(file: str) -> str:
    """A path as messages show it: quoted where whitespace or control characters would hide."""
    return repr(file) if file != file.strip() or not file.isprintable() else file


def where_in(path: Path, row: int, region: str, column: str) -> str:
    return f"{path}: row {row} (region {region!r}), column {column!r}"


def check_unique_ids(table: pd.DataFrame, path: Path) -> None:
    first: dict[str, int] = {}  # each id's first row (a list's index() was quadratic)
    for row, region in enumerate((str(r) for r in table.index), start=1):
        if not region or region.startswith("-"):  # '-h' would reach a command line as an option
            raise RegionsError(
                f"{where_in(path, row, region, 'region')}: expected an id starting with a letter, "
                f"digit or '_', found {region!r}"
            )
        if first.setdefault(region, row) != row:
            raise RegionsError(
                f"{where_in(path, row, region, 'region')}: duplicate region id, "
                f"already used in row {first[region]}"
            )


class Listed(Protocol):
    """An embedding raster as the table lists it (emb.prep.footprints.Footprint)."""

    where: str
    file: str


# NASS's CDL file names carry their year.
CDL_FILE_YEAR = re.compile(r"(?<![0-9])([0-9]{4})_(?:10|30)m_cdls", re.IGNORECASE)


def records(table: pd.DataFrame) -> Iterator[tuple[str, dict]]:
    """Each row of ``table`` as (region, its cells by column), in order: plain dicts (iterrows
    built a Series per row: 0.14 s of CPU a pass over 1,000 regions, against 0.01)."""
    return zip(table.index, table.to_dict("records"), strict=True)


def check_predict_only(table: pd.DataFrame, path: Path, run_sources: dict[str, str]) -> None:
    """A prediction-only row is there to be mapped: some run (``run_sources``: run -> source)
    must have one of its sources."""
    for row, (region, rec) in enumerate(records(table), start=1):
        if not is_predict_only(rec.get("split", "")):
            continue
        sources = [s for s in SOURCES if rec.get(s, "")]
        if not set(sources) & set(run_sources.values()):
            raise RegionsError(
                f"{where_in(path, row, region, 'split')}: a prediction-only row with "
                f"{' and '.join(sources)} rasters, but no run of runs {sorted(run_sources)} has "
                f"that source: add a run of {sources[0]} (e.g. {sources[0]}_segformer) to runs, "
                "or give the row a raster of a source a run has"
            )


def check_row_kind(rec: Mapping[str, str], where: str) -> None:
    """A training row needs its labels; a prediction-only row must not name any (which one
    did the user mean?)."""
    cdl = rec.get("cdl", "")
    if is_predict_only(rec.get("split", "")) and cdl:
        raise RegionsError(
            f"{where}: a prediction-only row (split {PREDICT!r}) names a CDL ({shown(cdl)}): "
            f"expected an empty cdl cell to map without labels, or another split to train on it"
        )
    if not is_predict_only(rec.get("split", "")) and not cdl:
        raise RegionsError(
            f"{where}: no CDL for a training row (split {rec.get('split', '') or 'auto'!r}): "
            f"expected a CDL raster, or split {PREDICT!r} to map this region without labels"
        )


def check_file_year(file: str, tags: dict[str, str], column: str, year: str, where: str) -> None:
    """A file whose own year contradicts the row's: embeddings of one year labelled with the
    CDL of another."""
    tags = {k.upper(): v for k, v in tags.items()}
    found = [(k, tags[k].strip()) for k in YEAR_TAGS if k in tags]
    if column == "cdl" and (match := CDL_FILE_YEAR.search(Path(file).name)):
        found.append(("the NASS file name", match.group(1)))
    for tag, value in found:
        if year and value != year:
            raise RegionsError(
                f"{where}: {shown(file)} says year {value} ({tag}), but the row's year "
                f"is {year}: expected the {year} product, or the year column set to {value}"
            )


def check_versions(tags: dict[str, dict[str, str]], footprints: dict[str, list[Listed]]) -> None:
    """One source's rasters must come from one dataset version: a model trained on a mix
    learns the versions' differences."""
    for source, prints in footprints.items():
        versions: dict[tuple[str, str], Listed] = {}
        for fp in prints:
            for key, value in tags.get(fp.file, {}).items():
                if "VERSION" in key.upper():
                    versions.setdefault((key, value.strip()), fp)
        keys = sorted({k for k, _ in versions})
        for key in keys:
            found = [(v, fp) for (k, v), fp in versions.items() if k == key]
            if len(found) > 1:
                (v1, a), (v2, b) = found[:2]
                raise RegionsError(
                    f"{b.where}: {shown(b.file)} is {source} {key}={v2}, but {shown(a.file)} "
                    f"({a.where}) is {key}={v1}: expected one dataset version per source; "
                    "download every region from the same version"
                )


def _overlaps(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


LABEL_SAMPLE = 1024  # CDL pixels per side read (decimated) to find labels over an embedding


@dataclass(frozen=True)
class Raster:
    """What the checks learn from one cell's raster."""

    file: str
    crs: CRS
    bounds: BoundingBox
    transform: Affine
    shape: tuple[int, int]
    tags: dict[str, str] = field(default_factory=dict, compare=False)
    # (device, inode), from the reader's stat: one file under two paths (links) is one file
    identity: tuple[int, int] = field(default=(0, 0), compare=False)
    # held open while its row is checked: the labels check reads the CDL through it
    dataset: DatasetReader | None = field(default=None, compare=False, repr=False)


@dataclass
class RegionChecks:
    """What the checks learn for the jobs: raster sizes, and per source the id each region's
    split blocks are drawn with (shared by the years of one ground) and, for such groups, the
    extent whose blocks the draw is made over."""

    pixels: dict[str, int] = field(default_factory=dict)
    split_keys: dict[str, dict[str, str]] = field(default_factory=dict)
    split_extents: dict[str, dict[str, tuple]] = field(default_factory=dict)
    product_tags: dict[str, dict[str, str]] = field(default_factory=dict)
    # per source, the ground of every region it trains on (what the block count is made over)
    footprints: dict[str, list[Footprint]] = field(default_factory=dict)

    def split_key(self, source: str, region: str) -> str:
        return self.split_keys.get(source, {}).get(region, region)

    def split_extent(self, source: str, region: str) -> tuple | None:
        return self.split_extents.get(source, {}).get(self.split_key(source, region))


def check_regions(
    table: pd.DataFrame,
    path: Path,
    generated: Iterable[str] = (),
    planned: Mapping[str, list[Footprint]] | None = None,
) -> RegionChecks:
    """Raise :class:`RegionsError` for the first unusable cell; ``generated`` paths are skipped.

    ``planned``: per source, the ground of generated rasters that will exist (an area's VRTs),
    compared with every other region's as the listed files are.

    Checked once, before any job: ids unique; a CDL for every training row and none for a
    prediction-only row; each raster readable with the bands, dtype and a north-up grid in
    ground metres its column needs; year tags that agree with the row; one dataset version per
    source; no embedding raster (same file, or same grid in one year) listed twice; no two
    regions of one year sharing ground (footprints compared in one CRS), and the years of one
    ground split alike; CDL labels present over each embedding raster. Value ranges are
    checked where the pixels are read (align_labels, shards, predict).
    """
    generated = set(generated)
    check_unique_ids(table, path)
    seen: dict[tuple, str] = {}  # an embedding raster's file or grid -> where it was listed
    checks = RegionChecks()
    listed: dict[str, list[Footprint]] = {s: [] for s in SOURCES}
    rows = list(enumerate(records(table), start=1))
    read_row = partial(_read_row, path=path, generated=generated)
    for (row, (region, rec)), read in in_order(read_row, rows, READERS):
        check_row_kind(rec, where_in(path, row, region, "cdl"))
        if not any(rec.get(s, "") for s in SOURCES):
            raise RegionsError(
                f"{where_in(path, row, region, 'aef')}: neither aef nor tessera is given"
            )
        opened: dict[str, Raster] = {}
        for column in (*SOURCES, "cdl"):
            file = rec.get(column, "")
            if not file or file in generated:
                continue
            where = where_in(path, row, region, column)
            raster = opened[column] = _outcome(read[column])
            checks.pixels[file] = raster.shape[0] * raster.shape[1]
            check_file_year(file, raster.tags, column, str(rec.get("year", "")), where)
            if column in SOURCES:
                _check_not_seen(raster, column, str(rec.get("year", "")), where, seen)
                checks.product_tags[file] = product_tags(raster.tags)
                listed[column].append(
                    Footprint(region, where, file, str(rec.get("year", "")), raster.crs,
                              raster.transform, raster.shape, str(rec.get("split", "")))
                )  # fmt: skip
        if "cdl" in opened:
            for source in SOURCES:
                if source in opened:
                    _outcome(read[f"labels over {source}"])
    for source, prints in (planned or {}).items():
        listed[source].extend(prints)
    check_versions(checks.product_tags, listed)  # prediction-only rows too: one version
    for source, everything in listed.items():
        # mapping trained ground is fine
        prints = [f for f in everything if not is_predict_only(f.split)]
        try:
            keys = ground_groups(prints)
        except FootprintError as err:
            raise RegionsError(str(err)) from None
        checks.split_keys[source] = keys
        checks.split_extents[source] = group_extent(prints, keys)
        checks.footprints[source] = prints
    return checks


# Rows whose files are read at once, ahead of the checks (GDAL's opens and reads release the
# GIL): the 3,000 rasters of bench/dry_run.py's 1,000 regions took 9.5 s one after another,
# 5-6 s with 2 to 8 readers on a shared 2-core machine; more cores, more gain. From
# forked_reads.FORK_FROM rows on, worker processes read them instead (the CRS each open
# builds holds the GIL).
READERS = 4
Outcome = Raster | Exception | None


def _read_row(
    item: tuple[int, tuple[str, Mapping[str, str]]], path: Path, generated: set[str]
) -> dict[str, Outcome]:
    """:func:`_read_row_open`'s outcomes, their datasets (closed by now) left behind: what
    a worker process sends back must pickle."""
    found = _read_row_open(item, path, generated)
    return {k: replace(v, dataset=None) if isinstance(v, Raster) else v for k, v in found.items()}


def _read_row_open(
    item: tuple[int, tuple[str, Mapping[str, str]]], path: Path, generated: set[str]
) -> dict[str, Outcome]:
    """A row's rasters opened and header-checked, and the CDL's labels under each embedding
    raster, as check_regions meets them (in a reader thread): each column's :class:`Raster`,
    or the error its check raised, which ends the row there as it ends the check. Every file is
    opened once; the CDL is read for both sources through one handle."""
    row, (region, rec) = item
    found: dict[str, Outcome] = {}
    with rasterio.Env.from_defaults(), ExitStack() as held:  # as rasterio.open's own
        for column in (*SOURCES, "cdl"):
            file = rec.get(column, "")
            if not file or file in generated:
                continue
            try:
                found[column] = _open_checked(
                    file, column, where_in(path, row, region, column), held
                )
            except Exception as err:  # noqa: BLE001 - raised by check_regions, in its place
                found[column] = err
                return found
        cdl = found.get("cdl")
        labelled: set[tuple] = set()  # the extents (CRS, bounds) the CDL has labels over
        for source in SOURCES:
            if isinstance(cdl, Raster) and source in found:
                try:
                    extent = (found[source].crs.to_wkt(), tuple(found[source].bounds))
                    if extent not in labelled:  # both sources on one grid: read once
                        _check_labels_over(cdl, found[source], where_in(path, row, region, "cdl"))
                        labelled.add(extent)
                    found[f"labels over {source}"] = None
                except Exception as err:  # noqa: BLE001 - raised by check_regions, in its place
                    found[f"labels over {source}"] = err
                    return found
    return found


def _outcome(outcome: Outcome) -> Raster | None:
    """What a reader thread found, or the error it met, raised here."""
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def _open_checked(file: str, column: str, where: str, held: ExitStack) -> Raster:
    """The raster's facts, after the checks that need only its header (its dataset stays open
    in ``held``)."""
    try:
        stat = os.stat(file)  # one stat: the file is there, and which file it is
    except (FileNotFoundError, NotADirectoryError, ValueError):  # where Path.exists is False
        hint = " (the cell has spaces around the path)" if file != file.strip() else ""
        raise RegionsError(f"{where}: file not found: {shown(file)}{hint}") from None
    identity = (stat.st_dev, stat.st_ino)
    if column == "tessera" and file.lower().endswith(".npy"):
        return replace(_open_tessera_npy(file, where), identity=identity)
    _check_vrt_sources(file, where)
    try:
        src = held.enter_context(rasterio.open(file))
        count, dtype, crs, transform = src.count, src.dtypes[0], src.crs, src.transform
        raster = Raster(file, crs, src.bounds, transform, (src.height, src.width), src.tags(),
                        identity, src)  # fmt: skip
        # the header alone may hide unreadable data: the first pixel is read (its checksum:
        # read() looks up every band's mask flags first, ~0.9 ms of a 128-band raster's
        # ~1.3 ms open and read, against 0.02 ms)
        src.checksum(1, window=Window(0, 0, 1, 1))
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


def _open_tessera_npy(file: str, where: str) -> Raster:
    """geotessera's native tile (int8 .npy + scales + landmask), converted by the workflow's
    tessera_npy rule: checked from its headers (emb.prep.tessera_npy)."""
    try:
        triple = tessera_npy.find_triple(file)
        facts = tessera_npy.check_triple(triple)
    except (tessera_npy.TesseraNpyError, OSError) as err:
        raise RegionsError(f"{where}: {stage_runner.message(err)}") from None
    raster = Raster(file, facts.crs, facts.bounds, facts.transform, (facts.height, facts.width),
                    triple.tags)  # fmt: skip
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
    sources = list(root.iter("SourceFilename"))
    if not sources:
        raise RegionsError(
            f"{where}: {shown(file)} is a VRT that lists no source file (expected at least "
            "one tile; gdalbuildvrt skips bottom-up tiles such as AEF's public COGs, which "
            "`gdalwarp -of VRT` or an areas: file mosaic)"
        )
    missing = []
    for source in sources:
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
    problem = ground_metre_problem(raster.crs, t, raster.shape)
    if problem:
        raise RegionsError(f"{where}: {shown(file)} {problem}")


CRS_NAMES: dict[str, str] = {}  # a CRS's WKT -> its to_string(), looked up once per CRS


def crs_name(crs: CRS) -> str:
    """``crs.to_string()``, found once per CRS, not once per raster (it searches for the CRS's
    authority code; thousands of rasters share a few CRSs)."""
    wkt = crs.to_wkt()
    if wkt not in CRS_NAMES:
        CRS_NAMES[wkt] = crs.to_string()
    return CRS_NAMES[wkt]


def _check_not_seen(
    raster: Raster, source: str, year: str, where: str, seen: dict[tuple, str]
) -> None:
    """The same embedding pixels under two regions would leak between one source's splits.
    An AEF and a TESSERA raster on one grid are fine: each source has its own shards; so are
    two years on one grid (multi-year training: their blocks share one split draw)."""
    grid = (crs_name(raster.crs), tuple(raster.transform), raster.shape)
    keys = [("file", source, raster.identity), ("grid", source, year, *grid)]
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
    with ExitStack() as held:
        src = (
            cdl.dataset if cdl.dataset is not None else held.enter_context(rasterio.open(cdl.file))
        )
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

"""What a row of the regions table says against its files: the kind of row (training or
prediction-only), the year the files carry, and one dataset version per source.

Every error names the table, the row (1-based, header excluded), the region and the column.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Protocol

import pandas as pd

from emb.rasters import SOURCES, YEAR_TAGS

PREDICT = "predict"  # the split of a prediction-only row: mapped, never labelled or scored


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


def check_unique_ids(table: pd.DataFrame, path: Path) -> None:
    rows = [str(r) for r in table.index]
    for row, region in enumerate(rows, start=1):
        if not region or region.startswith("-"):  # '-h' would reach a command line as an option
            raise RegionsError(
                f"{where_in(path, row, region, 'region')}: expected an id starting with a letter, "
                f"digit or '_', found {region!r}"
            )
        if rows.index(region) + 1 != row:
            raise RegionsError(
                f"{where_in(path, row, region, 'region')}: duplicate region id, "
                f"already used in row {rows.index(region) + 1}"
            )


class Listed(Protocol):
    """An embedding raster as the table lists it (emb.prep.footprints.Footprint)."""

    where: str
    file: str


def shown(file: str) -> str:
    """A path as messages show it: quoted where whitespace or control characters would hide."""
    return repr(file) if file != file.strip() or not file.isprintable() else file


def where_in(path: Path, row: int, region: str, column: str) -> str:
    return f"{path}: row {row} (region {region!r}), column {column!r}"


# NASS's CDL file names carry their year.
CDL_FILE_YEAR = re.compile(r"(?<![0-9])([0-9]{4})_(?:10|30)m_cdls", re.IGNORECASE)


def is_predict_only(split: str) -> bool:
    """A row of this split is mapped, never labelled or scored."""
    return split == PREDICT


def check_predict_only(table: pd.DataFrame, path: Path, run_sources: dict[str, str]) -> None:
    """A prediction-only row is there to be mapped: some run (``run_sources``: run -> source)
    must have one of its sources."""
    for row, (region, rec) in enumerate(table.iterrows(), start=1):
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


def check_row_kind(rec: pd.Series, where: str) -> None:
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

"""The input table ``regions.tsv``: parsing and the checks made before any job starts.

Every error names the table, the row (1-based, header excluded), the region and the column.
Files that the workflow itself generates (the demo region) are checked by their producer.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import rasterio
from rasterio.errors import RasterioIOError
from rasterio.warp import transform_bounds

from emb.rasters import BANDS, SOURCES


class RegionsError(ValueError):
    """A row of ``regions.tsv`` that cannot be used."""


def read_regions(path: str | Path) -> pd.DataFrame:
    """The table as strings (empty cells -> ""), indexed by region, rows in file order."""
    table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, comment="#")
    return table.set_index("region", drop=False)


def _where(path: Path, row: int, region: str, column: str) -> str:
    return f"{path}: row {row} (region {region!r}), column {column!r}"


def _bounds_in(src: rasterio.DatasetReader, crs) -> tuple[float, float, float, float]:
    return transform_bounds(src.crs, crs, *src.bounds, densify_pts=21)


def _overlaps(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


# What each column's raster must hold: a float AEF would be cast to int8 in the shards.
DTYPES = {"aef": ("int8",), "tessera": ("float32", "float64"), "cdl": ("uint8", "uint16")}


def check_regions(table: pd.DataFrame, path: Path, generated: Iterable[str] = ()) -> None:
    """Raise :class:`RegionsError` for the first unusable cell; ``generated`` paths are skipped."""
    generated = set(generated)
    rows = [str(r) for r in table.index]
    for row, region in enumerate(rows, start=1):
        if rows.index(region) + 1 != row:
            raise RegionsError(
                f"{_where(path, row, region, 'region')}: duplicate region id, "
                f"already used in row {rows.index(region) + 1}"
            )
    for row, (region, rec) in enumerate(table.iterrows(), start=1):
        if not any(rec.get(s, "") for s in SOURCES):
            raise RegionsError(
                f"{_where(path, row, region, 'aef')}: neither aef nor tessera is given"
            )
        opened: dict[str, tuple] = {}
        for column in (*SOURCES, "cdl"):
            file = rec.get(column, "")
            if not file or file in generated:
                continue
            where = _where(path, row, region, column)
            if not Path(file).exists():
                raise RegionsError(f"{where}: file not found: {file}")
            try:
                with rasterio.open(file) as src:
                    count, crs, bounds = src.count, src.crs, src.bounds
                    expected = BANDS.get(column, 1)
                    if count != expected:
                        raise RegionsError(
                            f"{where}: {file} has {count} bands, expected {expected}"
                        )
                    dtype = src.dtypes[0]
                    if dtype not in DTYPES[column]:
                        raise RegionsError(
                            f"{where}: {file} holds {dtype}, expected {' or '.join(DTYPES[column])}"
                        )
                    if crs is None:
                        raise RegionsError(f"{where}: {file} has no CRS")
                    opened[column] = (crs, bounds)
                    if column == "cdl":
                        for source, (emb_crs, emb_bounds) in opened.items():
                            if source != "cdl" and not _overlaps(
                                _bounds_in(src, emb_crs), emb_bounds
                            ):
                                raise RegionsError(
                                    f"{where}: {file} does not overlap the {source} raster "
                                    f"{rec[source]} (CDL bounds in its CRS: "
                                    f"{tuple(round(v) for v in _bounds_in(src, emb_crs))}, "
                                    f"embedding bounds {tuple(round(v) for v in emb_bounds)})"
                                )
            except RasterioIOError as err:
                raise RegionsError(f"{where}: cannot read {file} as a raster ({err})") from err

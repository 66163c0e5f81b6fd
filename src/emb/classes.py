"""The CDL -> L3 -> L2 -> L1 label hierarchy of ``config/classes.csv``.

Shards store only L3 ids; L2 and L1 come from lookup tables built here, so the three levels
can never disagree.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

IGNORE = 255
N_L1, N_L2, N_L3 = 2, 7, 61
COLUMNS = ["cdl_code", "cdl_name", "l3_id", "l3_name", "l2_id", "l2_name", "l1_id", "l1_name"]


class ClassTableError(ValueError):
    """``classes.csv`` breaks one of the hierarchy's invariants."""


@dataclass(frozen=True)
class ClassMap:
    """Lookup tables of the hierarchy; every table maps 255 (ignore) to 255.

    ``cdl_to_l3``: (256,) uint8, CDL code -> L3 id (255 for background and unmapped codes).
    ``l3_to_l2`` / ``l3_to_l1``: (256,) uint8, indexed by L3 id.
    """

    cdl_to_l3: np.ndarray
    l3_to_l2: np.ndarray
    l3_to_l1: np.ndarray
    l3_names: tuple[str, ...]
    l2_names: tuple[str, ...]
    l1_names: tuple[str, ...]

    def l3_of(self, codes: np.ndarray) -> np.ndarray:
        """L3 ids (uint8) of CDL ``codes`` of any integer dtype: codes beyond the table (a
        uint16 CDL's codes above 255) are unmapped, never wrapped onto another class."""
        n = len(self.cdl_to_l3)
        inside = (codes >= 0) & (codes < n)
        l3 = np.where(inside, self.cdl_to_l3[np.clip(codes, 0, n - 1)], IGNORE)
        return l3.astype(np.uint8)

    def levels(self, l3: np.ndarray) -> dict[str, np.ndarray]:
        """All three levels of an L3 array of any shape (255 stays 255)."""
        return {"l1": self.l3_to_l1[l3], "l2": self.l3_to_l2[l3], "l3": l3}


def _check(table: pd.DataFrame, path: Path) -> None:
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ClassTableError(f"{path}: missing columns {missing}; expected {COLUMNS}")
    dup = table["cdl_code"][table["cdl_code"].duplicated()].tolist()
    if dup:
        raise ClassTableError(f"{path}: CDL codes listed more than once: {dup}")
    for col, n in (("cdl_code", 256), ("l3_id", N_L3), ("l2_id", N_L2), ("l1_id", N_L1)):
        bad = table[(table[col] < 0) | (table[col] >= n)][col].tolist()
        if bad:
            raise ClassTableError(f"{path}: column {col} must lie in 0..{n - 1}, found {bad}")
    reserved = sorted({0, IGNORE} & set(table["cdl_code"]))
    if reserved:
        raise ClassTableError(
            f"{path}: CDL codes must lie in 1..254 (0 = background), found {reserved}"
        )
    for col, n in (("l3_id", N_L3), ("l2_id", N_L2), ("l1_id", N_L1)):
        found = sorted(set(table[col]))
        if found != list(range(n)):
            raise ClassTableError(
                f"{path}: column {col} must use every id 0..{n - 1}, found {found}"
            )
    pairs = (
        ("l3_id", "l2_id"),
        ("l2_id", "l1_id"),
        ("l3_id", "l3_name"),
        ("l2_id", "l2_name"),
        ("l1_id", "l1_name"),
    )
    for child, parent in pairs:
        per = table.groupby(child)[parent].nunique()
        if (per > 1).any():
            raise ClassTableError(
                f"{path}: each {child} must have one {parent}; ids with several: "
                f"{per[per > 1].index.tolist()}"
            )


def _read_table(path: Path) -> pd.DataFrame:
    """The CSV, after checking that every line has as many fields as the header: pandas
    would name neither the file nor, for a short row, the line."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    if not any(line.strip() for line in lines):
        raise ClassTableError(f"{path}: empty, expected a header line starting with cdl_code")
    width = len(next(csv.reader(lines[:1])))
    for number, fields in enumerate(csv.reader(lines[1:]), start=2):
        if fields and len(fields) != width:
            raise ClassTableError(
                f"{path}: line {number}: expected {width} comma-separated fields as in the "
                f"header, found {len(fields)}"
            )
    return pd.read_csv(io.StringIO("\n".join(lines)))


def load_class_map(path: str | Path) -> ClassMap:
    """Read and check ``classes.csv``; raises :class:`ClassTableError` naming the file."""
    path = Path(path)
    table = _read_table(path)
    for col in ("cdl_code", "l3_id", "l2_id", "l1_id"):
        if col in table and not pd.api.types.is_integer_dtype(table[col]):
            found = next(v for v in table[col] if not str(v).strip().lstrip("-").isdigit())
            raise ClassTableError(f"{path}: column {col} must hold integers, found {str(found)!r}")
    _check(table, path)
    cdl_to_l3 = np.full(256, IGNORE, np.uint8)
    cdl_to_l3[table["cdl_code"].to_numpy()] = table["l3_id"].to_numpy()
    by_l3 = table.drop_duplicates("l3_id").sort_values("l3_id")
    l3_to_l2 = np.full(256, IGNORE, np.uint8)
    l3_to_l1 = np.full(256, IGNORE, np.uint8)
    l3_to_l2[by_l3["l3_id"].to_numpy()] = by_l3["l2_id"].to_numpy()
    l3_to_l1[by_l3["l3_id"].to_numpy()] = by_l3["l1_id"].to_numpy()
    l2 = table.drop_duplicates("l2_id").sort_values("l2_id")
    l1 = table.drop_duplicates("l1_id").sort_values("l1_id")
    return ClassMap(
        cdl_to_l3=cdl_to_l3,
        l3_to_l2=l3_to_l2,
        l3_to_l1=l3_to_l1,
        l3_names=tuple(by_l3["l3_name"]),
        l2_names=tuple(l2["l2_name"]),
        l1_names=tuple(l1["l1_name"]),
    )

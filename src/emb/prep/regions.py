"""The input table ``regions.tsv``: reading it, and the row kinds (training or prediction-only).

Its files are checked while the workflow parses, before any job starts
(:mod:`emb.workflow.region_checks`). Every error names the table, the row (1-based, header
excluded), the region and the column.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

# A row's kind: training or prediction-only.

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


def is_predict_only(split: str) -> bool:
    """A row of this split is mapped, never labelled or scored."""
    return split == PREDICT

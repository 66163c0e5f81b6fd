"""A run's area estimates as one table: a row per (method, level, class), in hectares.

The columns are the file's contract (``results/area_estimates/{run}.csv``, docs/design.md):
the map's pixel count (``mapped_ha``), the estimate with its standard error and interval, the
user's, producer's and overall accuracy with their intervals, the sample units, and for the
test split's check the CDL's area of the same pixels and how often the interval covered it.
A standard error that cannot be estimated leaves its columns empty and says why in ``note``:
never a silent NaN, never a zero-width interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from emb.classes import ClassMap
from emb.estimation.estimators import AreaEstimates, Estimate
from emb.estimation.holdout_check import LevelCheck

CHECK = "test split, CDL reference"
USER_SAMPLE = "user sample"
COLUMNS = [
    "run", "method", "where", "level", "class_id", "class", "mapped_ha", "estimated_ha",
    "se_ha", "lo_ha", "hi_ha", "cdl_ha", "coverage", "draws", "users", "users_lo", "users_hi",
    "producers", "producers_lo", "producers_hi", "overall", "overall_lo", "overall_hi",
    "units_mapped", "units_reference", "note",
]  # fmt: skip


def class_names(cmap: ClassMap, level: int) -> tuple[str, ...]:
    return {1: cmap.l1_names, 2: cmap.l2_names, 3: cmap.l3_names}[level]


ZERO_SE = (
    "{what}: standard error 0 from the sample (no unit disagreed, or its strata were sampled "
    "whole): no interval given, it would have no width"
)
NO_DATA = "no data"  # the class past a level's ids: where an assessed map has no data
LOW_COVERAGE = 0.9  # below: the check's note says this class's intervals are too narrow


def _with_interval(est: Estimate | None, z: float, scale: float = 1.0) -> list[float | None]:
    """value, lo, hi (None where the estimate or its standard error does not exist, and no
    zero-width interval: a standard error of 0 gives none either)."""
    if est is None:
        return [None, None, None]
    interval = est.interval(z) if est.se else None
    lo, hi = (None, None) if interval is None else (interval[0] * scale, interval[1] * scale)
    return [est.value * scale, lo, hi]


def estimate_rows(
    estimates: AreaEstimates, level: int, cmap: ClassMap, pixel_ha: float, z: float,
    common: dict,
) -> list[dict]:  # fmt: skip
    """One row per class of ``estimates``; ``common``: run, method, where (and what the
    caller adds, e.g. the CDL's area per class under ``cdl_ha``)."""
    total_ha = estimates.total_px * pixel_ha
    names = class_names(cmap, level)
    overall = _with_interval(estimates.overall, z)
    rows = []
    for c in estimates.classes:
        value, lo, hi = _with_interval(c.proportion, z, total_ha)
        named = {
            "area": c.proportion,
            "user's accuracy": c.users,
            "producer's accuracy": c.producers,
            "overall accuracy": estimates.overall,
        }
        notes = [e.why for e in named.values() if e is not None and e.why]
        notes += [ZERO_SE.format(what=what) for what, e in named.items()
                  if e is not None and e.se == 0]  # fmt: skip
        se = c.proportion.se
        rows.append({
            **common,
            "level": level,
            "class_id": c.cls,
            "class": names[c.cls] if c.cls < len(names) else NO_DATA,
            "mapped_ha": c.mapped_px * pixel_ha,
            "estimated_ha": value,
            "se_ha": None if se is None else se * total_ha,
            "lo_ha": lo,
            "hi_ha": hi,
            **dict(zip(("users", "users_lo", "users_hi"), _with_interval(c.users, z),
                       strict=True)),
            **dict(zip(("producers", "producers_lo", "producers_hi"),
                       _with_interval(c.producers, z), strict=True)),
            **dict(zip(("overall", "overall_lo", "overall_hi"), overall, strict=True)),
            "units_mapped": c.units_mapped,
            "units_reference": c.units_reference,
            "note": "; ".join(dict.fromkeys(notes)),
        })  # fmt: skip
    return rows


def check_rows(
    run: str, checks: Sequence[LevelCheck], cmap: ClassMap, pixel_ha: float, z: float,
    where: str,
) -> list[dict]:  # fmt: skip
    """The test split's check: the first draw's estimates beside the CDL's area and the
    coverage of the intervals over every draw."""
    rows = []
    for chk in checks:
        common = {"run": run, "method": CHECK, "where": where, "draws": chk.draws}
        shown = estimate_rows(chk.estimates, chk.level, cmap, pixel_ha, z, common)
        names = class_names(cmap, chk.level)
        listed = {row["class_id"] for row in shown}
        for cls in np.flatnonzero(chk.cdl_px):  # the CDL holds it, the map and sample do not
            if int(cls) not in listed:
                shown.append({**common, "level": chk.level, "class_id": int(cls),
                              "class": names[cls], "mapped_ha": 0.0, "estimated_ha": 0.0,
                              "units_mapped": 0, "units_reference": 0,
                              "note": "in neither map nor sample: estimated 0"})  # fmt: skip
        for row in shown:
            cls = row["class_id"]
            tally = chk.coverage.get(cls)
            row["cdl_ha"] = float(chk.cdl_px[cls]) * pixel_ha
            row["coverage"] = tally.covered / chk.draws if tally else None
            if tally and tally.with_se < chk.draws:
                row["note"] = "; ".join(filter(None, [row.get("note"), (
                    f"an interval in {tally.with_se} of the {chk.draws} draws (the others: no "
                    "standard error, or one of 0)")]))  # fmt: skip
            if row["coverage"] is not None and row["coverage"] < LOW_COVERAGE:
                row["note"] = "; ".join(filter(None, [row["note"], (
                    f"the interval covered the CDL's area in {row['coverage']:.0%} of the draws: "
                    "too few units of this class for the normal approximation (a larger "
                    "area_estimates.sample.n gives more)")]))  # fmt: skip
            rows.append(row)
    return rows


def table(rows: list[dict]) -> pd.DataFrame:
    """The rows in the file's column order (largest estimated classes first per level)."""
    frame = pd.DataFrame(rows, columns=COLUMNS)
    if frame.empty:
        return frame
    frame = frame.sort_values(["method", "level", "estimated_ha"], ascending=[True, True, False],
                              kind="stable")  # fmt: skip
    return frame.reset_index(drop=True)


def largest(frame: pd.DataFrame, method: str, level: int, top: int) -> pd.DataFrame:
    """The ``top`` classes of one method and level by estimated area (the figure's rows)."""
    rows = frame[(frame["method"] == method) & (frame["level"] == level)]
    order = np.argsort(-rows["estimated_ha"].to_numpy(float), kind="stable")
    return rows.iloc[order[:top]]

"""emb.estimation.estimates_table: each column in its unit, against numbers computed here (Wald's
by hand, the interval that holds from emb.estimation.intervals), the notes, the precision, the
order and both coverage columns."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import REPO

from emb.classes import load_class_map
from emb.estimation import intervals
from emb.estimation.estimates_table import check_rows, estimate_rows, largest, table
from emb.estimation.estimators import olofsson, z_of
from emb.estimation.holdout_check import ClassCoverage, LevelCheck
from emb.estimation.settings import from_json

CMAP = load_class_map(REPO / "config" / "classes.csv")
PX = [6000, 3000, 1000]  # N_i of map classes 0, 1, 2 (L3)
MATRIX = [[40, 5, 5], [4, 30, 6], [0, 2, 18]]
HA = 0.01
SETTINGS = from_json('{"confidence": 0.9}')  # not 0.95: the table must use the level given
Z = z_of(0.9)


def by_hand(j: int) -> tuple[float, float]:
    """Olofsson et al. 2014's area proportion of class j and its SE, written out."""
    total = sum(PX)
    p = v = 0.0
    for big_n, row in zip(PX, MATRIX, strict=True):
        n, q = sum(row), row[j] / sum(row)
        p += big_n / total * q
        v += (big_n / total) ** 2 * q * (1 - q) / (n - 1)
    return p, math.sqrt(v)


def rows_of(px: list[int], matrix: list[list[int]]) -> dict[int, dict]:
    est = olofsson(np.array(px), np.array(matrix), SETTINGS.confidence)
    rows = estimate_rows(est, 3, CMAP, HA, SETTINGS, {"run": "r", "method": "m", "where": "w"})
    return {r["class_id"]: r for r in rows}


def test_each_class_row_in_hectares_with_both_intervals_and_accuracies() -> None:
    est = olofsson(np.array(PX), np.array(MATRIX), SETTINGS.confidence)
    rows = rows_of(PX, MATRIX)
    total_ha = sum(PX) * HA
    n_h, hits = np.array(MATRIX).sum(1), np.array(MATRIX).T
    held = intervals.area(np.array(PX), n_h, hits, SETTINGS.confidence)
    for j in range(3):
        row, (p, se) = rows[j], by_hand(j)
        assert row["class"] == CMAP.l3_names[j] and row["confidence"] == 0.9
        assert row["mapped_ha"] == pytest.approx(PX[j] * HA)
        assert row["estimated_ha"] == pytest.approx(p * total_ha)
        assert row["se_ha"] == pytest.approx(se * total_ha)
        assert row["wald_lo_ha"] == pytest.approx((p - Z * se) * total_ha)
        assert row["wald_hi_ha"] == pytest.approx((p + Z * se) * total_ha)
        assert [row["lo_ha"], row["hi_ha"]] == pytest.approx(
            [held.lo[j] * total_ha, held.hi[j] * total_ha]
        )
        assert row["units_mapped"] == sum(MATRIX[j])
        assert row["units_reference"] == sum(r[j] for r in MATRIX)
        c = est.classes[j]
        for name in ("users", "producers"):
            e = getattr(c, name)
            assert [row[name], row[f"{name}_wald_lo"], row[f"{name}_wald_hi"]] == pytest.approx(
                [e.value, e.value - Z * e.se, e.value + Z * e.se]
            ), name
            assert [row[f"{name}_lo"], row[f"{name}_hi"]] == pytest.approx([e.lo, e.hi]), name
            assert 0 <= e.lo < e.value < e.hi <= 1, name
        o = est.overall
        assert [row["overall"], row["overall_wald_lo"], row["overall_wald_hi"]] == pytest.approx(
            [o.value, o.value - Z * o.se, o.value + Z * o.se]
        )
        assert [row["overall_lo"], row["overall_hi"]] == pytest.approx([o.lo, o.hi])


def test_no_interval_only_where_no_method_bounds_it_and_the_note_says_why() -> None:
    lone = rows_of([6000, 3000, 3], [[40, 5, 5], [4, 30, 6], [0, 0, 1]])
    assert lone[0]["lo_ha"] is None and lone[0]["se_ha"] is None
    assert lone[0]["wald_lo_ha"] is None
    assert "area: no interval, the sample cannot bound it (stratum 2" in lone[0]["note"]
    exact = rows_of(PX, [[40, 5, 0], [4, 36, 0], [0, 0, 20]])  # U_2 = 1, SE 0
    assert exact[2]["users_wald_lo"] is None and exact[2]["users_wald_hi"] is None
    assert exact[2]["users_lo"] < 1 and exact[2]["users_hi"] == 1.0  # an interval that holds
    assert "user's accuracy: Wald standard error 0" in exact[2]["note"]
    census = rows_of([50, 40, 20], [[50, 0, 0], [2, 38, 0], [0, 1, 19]])  # every stratum whole
    assert census[1]["lo_ha"] is None and census[1]["wald_lo_ha"] is None
    assert "area: its strata were sampled whole: known exactly" in census[1]["note"]


def test_the_csv_holds_its_figures_at_a_useful_precision() -> None:
    frame = table(list(rows_of(PX, MATRIX).values()))
    for column in ("estimated_ha", "lo_ha", "hi_ha", "wald_lo_ha", "se_ha"):
        assert (frame[column] == frame[column].round(2)).all(), column
    for column in ("users", "users_lo", "producers_hi", "overall_wald_lo"):
        assert (frame[column] == frame[column].round(4)).all(), column
    assert frame["lo_ha"].map(lambda v: len(repr(v))).max() <= 10


def test_the_table_puts_the_largest_estimate_first_and_largest_takes_the_top() -> None:
    rows = list(rows_of(PX, MATRIX).values())
    frame = table(rows)
    assert list(frame["estimated_ha"]) == sorted(frame["estimated_ha"], reverse=True)
    top = largest(frame, "m", 3, 2)
    assert list(top["class_id"]) == list(frame["class_id"][:2])


def coverage_rows(tallies: dict[int, ClassCoverage], draws: int = 200) -> dict[int, dict]:
    est = olofsson(np.array(PX), np.array(MATRIX), SETTINGS.confidence)
    chk = LevelCheck(
        level=3, estimates=est, mapped_px=np.array(PX + [0] * 58),
        cdl_px=np.array([5000, 4000, 1000] + [0] * 58), coverage=tallies, draws=draws,
    )  # fmt: skip
    return {r["class_id"]: r for r in check_rows("r", [chk], CMAP, HA, SETTINGS, "w")}


def test_coverage_is_the_share_of_draws_covered_for_both_methods_and_a_low_one_is_noted() -> None:
    rows = coverage_rows({0: ClassCoverage(190, 200, 0, 170, 200), 1: ClassCoverage(150, 200, 0,
                          120, 180), 2: ClassCoverage(0, 0, 0, 0, 0)})  # fmt: skip
    assert rows[0]["coverage"] == 0.95 and rows[0]["wald_coverage"] == 0.85
    assert rows[1]["coverage"] == 0.75 and rows[1]["wald_coverage"] == 0.6
    assert rows[2]["coverage"] is None and "no interval in any of the 200 draws" in rows[2]["note"]
    assert rows[0]["cdl_ha"] == pytest.approx(50.0)
    assert "90% interval covered the CDL's area in 75.0% of the draws" in rows[1]["note"]
    assert "covered the CDL's area" not in rows[0]["note"]


def test_the_low_coverage_note_starts_below_90_percent_not_at_it() -> None:
    rows = coverage_rows({0: ClassCoverage(180, 200, 0, 0, 0), 1: ClassCoverage(179, 200, 0, 0,
                          0)})  # fmt: skip
    assert rows[0]["coverage"] == 0.9 and "covered the CDL's area" not in rows[0]["note"]
    assert "covered the CDL's area in 89.5% of the draws, below 90%" in rows[1]["note"]


def test_strata_sampled_whole_have_no_coverage_and_no_advice_to_raise_n() -> None:
    rows = coverage_rows({0: ClassCoverage(0, 0, 200, 0, 0)})
    assert rows[0]["coverage"] is None and rows[0]["wald_coverage"] is None
    assert "sampled its strata whole" in rows[0]["note"]
    assert "sample.n" not in rows[0]["note"] and "0.0%" not in rows[0]["note"]


def test_the_draws_with_an_interval_are_counted_and_said() -> None:
    rows = coverage_rows({0: ClassCoverage(150, 160, 40, 100, 120)})
    assert "an interval in 160 of the 200 draws" in rows[0]["note"]
    assert rows[0]["coverage"] == 0.75  # the draws without an interval count as misses

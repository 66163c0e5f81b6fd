"""H6's proposed tests for emb.estimation.estimates_table: each column in its unit, against numbers
computed here, the notes, the order and the coverage column."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import REPO

from emb.classes import load_class_map
from emb.estimation.estimates_table import check_rows, estimate_rows, largest, table
from emb.estimation.estimators import olofsson, z_of
from emb.estimation.holdout_check import ClassCoverage, LevelCheck

CMAP = load_class_map(REPO / "config" / "classes.csv")
PX = [6000, 3000, 1000]  # N_i of map classes 0, 1, 2 (L3)
MATRIX = [[40, 5, 5], [4, 30, 6], [0, 2, 18]]
HA = 0.01
Z = z_of(0.9)  # not 1.96: the table must use the z it is given


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
    est = olofsson(np.array(px), np.array(matrix))
    rows = estimate_rows(est, 3, CMAP, HA, Z, {"run": "r", "method": "m", "where": "w"})
    return {r["class_id"]: r for r in rows}


def test_each_class_row_in_hectares_with_its_interval_and_accuracies() -> None:
    est = olofsson(np.array(PX), np.array(MATRIX))
    rows = rows_of(PX, MATRIX)
    total_ha = sum(PX) * HA
    for j in range(3):
        row, (p, se) = rows[j], by_hand(j)
        assert row["class"] == CMAP.l3_names[j]
        assert row["mapped_ha"] == pytest.approx(PX[j] * HA)
        assert row["estimated_ha"] == pytest.approx(p * total_ha)
        assert row["se_ha"] == pytest.approx(se * total_ha)
        assert row["lo_ha"] == pytest.approx((p - Z * se) * total_ha)
        assert row["hi_ha"] == pytest.approx((p + Z * se) * total_ha)
        assert row["units_mapped"] == sum(MATRIX[j])
        assert row["units_reference"] == sum(r[j] for r in MATRIX)
        c = est.classes[j]
        for name in ("users", "producers"):
            e = getattr(c, name)
            assert [row[name], row[f"{name}_lo"], row[f"{name}_hi"]] == pytest.approx(
                [e.value, e.value - Z * e.se, e.value + Z * e.se]
            ), name
        o = est.overall
        assert [row["overall"], row["overall_lo"], row["overall_hi"]] == pytest.approx(
            [o.value, o.value - Z * o.se, o.value + Z * o.se]
        )


def test_no_interval_where_the_standard_error_is_none_or_zero_and_the_note_says_why() -> None:
    lone = rows_of([6000, 3000, 3], [[40, 5, 5], [4, 30, 6], [0, 0, 1]])
    assert lone[0]["lo_ha"] is None and lone[0]["se_ha"] is None
    assert "1 sample unit" in lone[0]["note"]
    exact = rows_of(PX, [[40, 5, 0], [4, 36, 0], [0, 2, 18]])  # class 2: never off its stratum
    assert exact[2]["users"] == 18 / 20 and exact[0]["users_lo"] is not None
    exact = rows_of(PX, [[40, 5, 0], [4, 36, 0], [0, 0, 20]])  # U_2 = 1, SE 0
    assert exact[2]["users_lo"] is None and exact[2]["users_hi"] is None
    assert "user's accuracy: standard error 0" in exact[2]["note"]


def test_the_table_puts_the_largest_estimate_first_and_largest_takes_the_top() -> None:
    rows = list(rows_of(PX, MATRIX).values())
    frame = table(rows)
    assert list(frame["estimated_ha"]) == sorted(frame["estimated_ha"], reverse=True)
    top = largest(frame, "m", 3, 2)
    assert list(top["class_id"]) == list(frame["class_id"][:2])


def test_coverage_is_the_share_of_draws_covered_and_a_low_one_is_noted() -> None:
    est = olofsson(np.array(PX), np.array(MATRIX))
    chk = LevelCheck(
        level=3, estimates=est, mapped_px=np.array(PX + [0] * 58),
        cdl_px=np.array([5000, 4000, 1000] + [0] * 58),
        coverage={0: ClassCoverage(190, 200, 0), 1: ClassCoverage(150, 200, 0),
                  2: ClassCoverage(0, 0, 0)},
        draws=200,
    )  # fmt: skip
    rows = {r["class_id"]: r for r in check_rows("r", [chk], CMAP, HA, Z, "w")}
    assert rows[0]["coverage"] == 0.95 and rows[1]["coverage"] == 0.75
    assert rows[2]["coverage"] == 0.0
    assert rows[0]["cdl_ha"] == pytest.approx(50.0)
    assert "covered the CDL's area in 75%" in rows[1]["note"]
    assert "covered the CDL's area" not in rows[0]["note"]

"""How many units to label (emb.estimation.sample_size): the allocation against a hand
computation on a small error matrix, and what it delivers on a simulated population."""

from __future__ import annotations

import math

import numpy as np
import pytest
from area_population import NAMES, population

from emb.estimation import intervals
from emb.estimation.sample_size import (
    SampleSizeError,
    allocation,
    expected_half_width,
    pilot_shares,
)

STRATA = np.array([8000, 1500, 500])
PILOT = np.array([[45, 4, 1], [3, 27, 0], [0, 0, 20]])  # rows: map classes = strata


def test_zero_cells_are_floored_at_their_clopper_pearson_bound() -> None:
    q = pilot_shares(PILOT, 0.95)
    bound_30, bound_20 = 1 - 0.025 ** (1 / 30), 1 - 0.025 ** (1 / 20)
    assert q[1, 2] == pytest.approx(bound_30)  # no omission seen: not 0
    assert q[2, 0] == pytest.approx(bound_20) and q[2, 2] == pytest.approx(1 - bound_20)
    assert q[0, 1] == pytest.approx(4 / 50)  # a seen share stays
    with pytest.raises(SampleSizeError, match="stratum 1 has no unit"):
        pilot_shares(np.array([[3, 1], [0, 0]]), 0.95)


def neyman_by_hand(q: np.ndarray, share: np.ndarray, target: float, z: float) -> np.ndarray:
    """Cochran's 5.26 for every class, the per-stratum maximum, written out."""
    w = STRATA / STRATA.sum()
    want = np.full(3, 5.0)
    for k in range(3):  # every class holds >= 5% of the map
        s = np.sqrt(q[:, k] * (1 - q[:, k]))
        var = (target * share[k] / z) ** 2
        n = (w @ s) ** 2 / (var + (w * s**2).sum() / STRATA.sum())
        want = np.maximum(want, [math.ceil(n * w[h] * s[h] / (w @ s)) for h in range(3)])
    return np.minimum(want, STRATA).astype(int)


def test_the_allocation_against_a_hand_computation() -> None:
    z = 1.959963984540054
    got = allocation(STRATA, PILOT, target=0.1, min_share=0.05, min_per_stratum=5, confidence=0.95)
    w = STRATA / STRATA.sum()
    q = pilot_shares(PILOT, 0.95)
    share = w @ (PILOT / PILOT.sum(1, keepdims=True))
    first = neyman_by_hand(q, share, 0.1, z)  # round 1: the pilot's shares
    assert (got.units >= first).all() and got.units.sum() < 2 * first.sum()
    n = got.units[:, None].astype(float)
    seen = (n * q + 0.5) / (n + 1)  # the shares the interval will see at these units
    assert got.units.tolist() == neyman_by_hand(seen, share, 0.1, z).tolist()  # a fixed point
    assert got.targeted.all() and got.total == int(got.units.sum())
    by_hand = z * np.sqrt((w[:, None] ** 2 * seen * (1 - seen) * (1 / n - 1 / STRATA[:, None]))
                          .sum(0)) / share  # fmt: skip
    assert got.expected == pytest.approx(by_hand)
    k = int(np.argmax(got.expected))  # the binding class sits at the target
    assert got.expected[k] == pytest.approx(0.1, rel=0.02)
    fewer = got.units.copy()
    fewer[np.argmax(w * np.sqrt(seen[:, k] * (1 - seen[:, k])))] -= 10
    assert expected_half_width(STRATA, fewer, q, share, z)[k] > 0.1


def test_a_class_below_min_share_is_not_targeted_and_a_bad_target_is_refused() -> None:
    got = allocation(STRATA, PILOT, target=0.1, min_share=0.1, min_per_stratum=5, confidence=0.95)
    assert got.targeted.tolist() == [True, True, False]  # class 2 holds 5% of the map
    with pytest.raises(SampleSizeError, match="target: expected a relative half-width"):
        allocation(STRATA, PILOT, target=0, min_share=0.1, min_per_stratum=5, confidence=0.95)
    with pytest.raises(SampleSizeError, match=r"expected a \(3, 3\) error matrix"):
        allocation(STRATA, PILOT[:2], target=0.1, min_share=0.1, min_per_stratum=5,
                   confidence=0.95)  # fmt: skip


def test_samples_of_the_recommended_size_deliver_the_target_within_20_percent() -> None:
    pop = population()  # its error matrix as the test split's check holds it: the pilot
    rec = allocation(pop.strata_px, pop.joint, target=0.1, min_share=0.01, min_per_stratum=20,
                     confidence=0.95)  # fmt: skip
    assert rec.targeted[NAMES.index("rare")]  # 1.4% of the map: reported
    rng = np.random.default_rng(5)
    draws = 400
    samples = np.zeros((draws, len(NAMES), len(NAMES)), np.int64)
    for h, units in enumerate(rec.units):
        samples[:, h] = rng.multivariate_hypergeometric(pop.joint[h], int(units), size=draws)
    n_h = samples.sum(2)  # (draws, H)
    delivered = {}
    for k in np.flatnonzero(rec.targeted):
        b = intervals.area(pop.strata_px, n_h, samples[:, :, k], 0.95)
        estimate = (pop.strata_px / pop.strata_px.sum() * samples[:, :, k] / n_h).sum(1)
        delivered[NAMES[k]] = float(np.mean((b.hi - b.lo) / 2 / estimate))
    assert all(v <= 0.1 * 1.2 for v in delivered.values()), delivered
    assert max(delivered.values()) >= 0.1 * 0.8, delivered  # the binding class: not oversized
    for k in np.flatnonzero(rec.targeted):  # and as expected, within 20%
        assert delivered[NAMES[k]] == pytest.approx(rec.expected[k], rel=0.2), NAMES[k]

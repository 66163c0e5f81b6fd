"""Why the block floor is 10: below it a block bootstrap's 95% interval misses the truth far
more often than 5% of the time (the figures quoted in emb.evaluation.bootstrap)."""

from __future__ import annotations

import numpy as np
from test_bootstrap import population

from emb.evaluation.bootstrap import MIN_BLOCKS, BootstrapSettings, block_intervals
from emb.metrics import scores_from_confusion


def coverage(n_blocks: int, splits: int = 400) -> float:
    """Share of ``splits`` simulated test splits of ``n_blocks`` blocks whose 95% interval of
    OA covers the population's OA (the floor lifted to see below it)."""
    pop = population(20_000, 1, 7)[:, 0]
    truth = scores_from_confusion(pop.sum(0))["oa"]
    rng = np.random.default_rng(3)
    s = BootstrapSettings(resamples=300, seed=11, min_blocks=2)
    hits = [
        (iv := block_intervals(pop[rng.integers(0, len(pop), n_blocks)], s))["oa_lo"]
        <= truth
        <= iv["oa_hi"]
        for _ in range(splits)
    ]
    return float(np.mean(hits))


def test_the_floor_is_where_the_interval_starts_to_mean_its_level() -> None:
    """Measured: 2 blocks cover ~48%, 4 ~80%, 10 ~91% (nominal 95%)."""
    assert MIN_BLOCKS == 10
    few, floor = coverage(4), coverage(MIN_BLOCKS)
    assert few < 0.85 and floor >= 0.87, (few, floor)
    assert coverage(2, 200) < 0.6

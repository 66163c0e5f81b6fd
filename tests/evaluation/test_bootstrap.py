"""The block bootstrap: its intervals cover a known truth, and resampling tiles would not."""

from __future__ import annotations

import numpy as np
import pytest

from emb.evaluation.bootstrap import (
    BootstrapSettings,
    block_intervals,
    paired_difference,
    stacked_figures,
    verdict,
)
from emb.metrics import scores_from_confusion

N_CLASSES = 3


def population(n_blocks: int, tiles: int, seed: int) -> np.ndarray:
    """(n_blocks, tiles, 3, 3) int matrices: each block has its own class mix and accuracy
    (block-level variation, shared by its tiles), tiles add a little of their own."""
    rng = np.random.default_rng(seed)
    mix = rng.dirichlet(np.full(N_CLASSES, 2.0), size=n_blocks)  # (B, 3)
    acc = rng.beta(6, 2, size=n_blocks)  # (B,)
    tile_acc = np.clip(acc[:, None] + rng.normal(0, 0.02, (n_blocks, tiles)), 0, 1)
    pixels = 200
    ref = rng.multinomial(pixels, mix, size=(tiles, n_blocks)).transpose(1, 0, 2)  # (B, T, 3)
    right = rng.binomial(ref, tile_acc[..., None])
    wrong = ref - right
    cms = np.zeros((n_blocks, tiles, N_CLASSES, N_CLASSES), dtype=np.int64)
    for c in range(N_CLASSES):
        cms[:, :, c, c] = right[..., c]
        cms[:, :, c, (c + 1) % N_CLASSES] = wrong[..., c]  # errors go to the next class
    return cms


def test_stacked_figures_match_metrics() -> None:
    cms = population(4, 1, 1)[:, 0]
    cms[0, 2] = 0  # a class absent from the reference of one matrix
    figs = stacked_figures(cms)
    for i, cm in enumerate(cms):
        ref = scores_from_confusion(cm)
        for name in ("oa", "miou", "f1"):
            assert figs[name][i] == pytest.approx(ref[name])


def coverage(per_split: np.ndarray, truth: float, figure: str, s: BootstrapSettings) -> float:
    """Share of simulated test splits (S, units, n, n) whose interval covers ``truth``."""
    hits = [
        iv[f"{figure}_lo"] <= truth <= iv[f"{figure}_hi"]
        for iv in (block_intervals(split, s) for split in per_split)
    ]
    return float(np.mean(hits))


def test_block_intervals_cover_the_truth() -> None:
    """1,000 test splits of 40 blocks drawn from a 20,000-block population: the 95% interval
    of OA and mIoU covers the population figure in 93-97% of them."""
    pop = population(20_000, 1, 7)[:, 0]
    truth = scores_from_confusion(pop.sum(0))
    rng = np.random.default_rng(3)
    splits = pop[rng.integers(0, len(pop), size=(1000, 40))]
    s = BootstrapSettings(resamples=400, seed=11)
    for figure in ("oa", "miou"):
        assert 0.93 <= coverage(splits, truth[figure], figure, s) <= 0.97


def test_resampling_tiles_under_covers_correlated_data() -> None:
    """Tiles of a block share its accuracy: treating 8 blocks x 5 tiles as 40 independent
    tiles gives intervals that are too narrow, resampling the 8 blocks does not."""
    pop = population(4000, 5, 8)  # (blocks, tiles, n, n)
    truth = scores_from_confusion(pop.sum((0, 1)))["oa"]
    rng = np.random.default_rng(5)
    picked = pop[rng.integers(0, len(pop), size=(600, 8))]  # (S, 8, 5, n, n)
    s = BootstrapSettings(resamples=400, seed=2)
    by_block = coverage(picked.sum(2), truth, "oa", s)
    by_tile = coverage(picked.reshape(600, 40, N_CLASSES, N_CLASSES), truth, "oa", s)
    assert by_tile < 0.80 < by_block


def test_paired_difference_uses_shared_blocks_only() -> None:
    cms = population(30, 1, 4)[:, 0]
    a = {f"b{i}": cm for i, cm in enumerate(cms)}
    better = {k: np.diag(np.diag(cm)) + 0 * cm for k, cm in a.items()}  # every pixel right
    better["only_b"] = cms[0]
    diff = paired_difference(a, better)
    assert diff is not None and diff["blocks"] == 30 and diff["reliable"]
    assert 0 < diff["oa_lo"] <= diff["oa"] <= diff["oa_hi"]
    assert "not" not in verdict("B - A OA L1", "oa", diff)
    assert paired_difference(a, {"elsewhere": cms[0]}) is None
    same = paired_difference(a, a)
    assert same["miou"] == 0 and same["miou_lo"] == 0 == same["miou_hi"]


def test_few_blocks_are_flagged() -> None:
    cms = population(5, 1, 9)[:, 0]
    iv = block_intervals(cms)
    assert iv["blocks"] == 5 and not iv["reliable"]
    diff = paired_difference({str(i): c for i, c in enumerate(cms)}, {"0": cms[0]})
    assert "unreliable" in verdict("B - A", "miou", diff)

"""The block bootstrap: its intervals cover a known truth, and resampling tiles would not."""

from __future__ import annotations

import numpy as np
import pytest

from emb.evaluation.bootstrap import (
    DISTINGUISHABLE,
    NO_VERDICT,
    NOT_DISTINGUISHABLE,
    BootstrapError,
    BootstrapSettings,
    block_intervals,
    distinguishable,
    paired_difference,
    stacked_figures,
    verdict,
    verdict_of,
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
    s = BootstrapSettings(resamples=400, seed=2, min_blocks=2)  # the floor lifted, to compare
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


def test_below_the_floor_there_is_no_interval_and_no_verdict() -> None:
    """9 blocks: no bound at all (not a narrow one), the difference alone, and the sentence
    says why; 10 blocks: an interval and a verdict."""
    cms = population(12, 1, 9)[:, 0]
    iv = block_intervals(cms[:9])
    assert iv["blocks"] == 9 and not iv["reliable"]
    assert iv["miou_lo"] is None and iv["oa_hi"] is None and iv["iou_lo"] == [None] * N_CLASSES
    assert isinstance(block_intervals(cms[:10])["miou_lo"], float)
    a = {str(i): c for i, c in enumerate(cms[:9])}
    b = {k: np.diag(np.diag(c)) for k, c in a.items()}  # every pixel right: far better
    diff = paired_difference(a, b)
    assert diff["blocks"] == 9 and diff["oa"] > 0.05 and diff["oa_lo"] is None
    assert verdict_of(diff, "oa") == NO_VERDICT
    text = verdict("B - A OA L1", "oa", diff)
    assert "only 9 shared test blocks (fewer than 10)" in text and "[" not in text
    assert " distinguishable" not in text.replace("no interval and no verdict", "")
    a["9"], b["9"] = cms[9], np.diag(np.diag(cms[9]))
    assert verdict_of(paired_difference(a, b), "oa") == DISTINGUISHABLE


def test_the_floor_counts_the_blocks_both_runs_share_not_either_runs_own() -> None:
    """Run a scored on 12 blocks, run b on 12 of which it shares 4 with a (8 elsewhere), far
    better on those 4: 4 shared blocks are below the floor, so no interval and no verdict,
    though each run alone has 12."""
    cms = population(20, 1, 6)[:, 0]
    a = {f"b{i}": cm for i, cm in enumerate(cms[:12])}
    b = {f"b{i}": np.diag(np.diag(a[f"b{i}"])) for i in range(4)}  # every pixel right
    b |= {f"elsewhere{i}": cm for i, cm in enumerate(cms[12:])}
    assert len(a) == len(b) == 12 and len(set(a) & set(b)) == 4
    diff = paired_difference(a, b)
    assert diff["blocks"] == 4 and not diff["reliable"]
    assert diff["oa"] > 0.05 and diff["oa_lo"] is None and diff["oa_hi"] is None
    assert verdict_of(diff, "oa") == verdict_of(diff, "miou") == NO_VERDICT
    text = verdict("B - A OA L1", "oa", diff)
    assert "only 4 shared test blocks (fewer than 10)" in text and "[" not in text


def test_an_interval_touching_zero_is_never_distinguishable() -> None:
    """12 blocks on which b equals a except one: the lower bound is 0 (or rounds to it), so
    no verdict of a difference; a clear gap is one."""
    cms = population(12, 1, 5)[:, 0]
    a = {f"b{i}": cm for i, cm in enumerate(cms)}
    b = dict(a)
    b["b0"] = np.diag(np.diag(cms[0]))  # better on one block only
    diff = paired_difference(a, b)
    assert diff["reliable"] and round(diff["oa_lo"], 3) == 0.0 < diff["oa_hi"]
    assert verdict_of(diff, "oa") == NOT_DISTINGUISHABLE
    assert ": not distinguishable" in verdict("B - A OA L1", "oa", diff)
    assert distinguishable(0.0, 0.18) is False and distinguishable(-0.2, 0.0) is False
    assert distinguishable(0.0004, 0.18) is False  # shown as [+0.000, +0.180]
    assert distinguishable(0.0006, 0.18) is True and distinguishable(-0.3, -0.3) is True
    assert distinguishable(None, None) is None and distinguishable(float("nan"), 1.0) is None


@pytest.mark.parametrize(
    ("field", "value"), [("resamples", 0), ("resamples", -5), ("seed", -1), ("level", 1.5),
                         ("level", 0.0), ("min_blocks", 1)]
)  # fmt: skip
def test_settings_that_give_no_interval_are_refused_naming_the_option(
    field: str, value: float
) -> None:
    with pytest.raises(BootstrapError, match=f"bootstrap {field}: expected .* found {value}"):
        BootstrapSettings(**{field: value})

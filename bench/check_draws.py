"""What the test split's check costs in its draws, beside one estimate of one sample.

A synthetic population like the tests' (``tests/estimation/area_population.py``): ``--classes``
L3 classes of log-uniform areas, mapped right 80% of the time and otherwise as another class
(mostly of the same L2 group), ``--pixels`` pixels, split into ``--districts`` districts
and the outside (each cell's pixels at random). Then, the best of ``--repeat`` runs each:

- one pass: one stratified sample (the check's allocation) estimated at L1, L2 and L3 by
  ``holdout_check.estimate_at``, the work of one draw done one draw at a time;
- check: ``holdout_check.check`` with ``--draws`` draws (what ``area_estimates`` runs);
- districts: ``district_check.check_districts`` with the same draws, every domain.

It prints each one's seconds, the cost per draw, and the ratio of each check to one pass (a
check estimating its draws one at a time costs about ``--draws`` passes, plus its sampling).
Only the public functions above are used, so the same script times another tree: run it with
``PYTHONPATH=<tree>/src`` for each, in one session, and compare the ratios (the machine's
load moves the seconds, less the ratios).

Usage: ``python bench/check_draws.py [--draws 200] [--pixels 5000000] [--classes 40]
[--districts 3] [--level 3] [--n 1000] [--repeat 3] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from emb.classes import N_L3, load_class_map
from emb.estimation.district_check import check_districts
from emb.estimation.holdout_check import StratifiedSampler, check, estimate_at
from emb.estimation.holdout_counts import LEVEL_CLASSES, TestSplitCounts
from emb.estimation.population import level_table
from emb.estimation.settings import from_json

CLASSES = Path(__file__).resolve().parents[1] / "config" / "classes.csv"


def population(
    pixels: int, classes: int, districts: int, seed: int, cmap: object
) -> TestSplitCounts:
    """The joint counts (domain, map L3, CDL L3) of a synthetic test split."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(N_L3, classes, replace=False))
    share = np.exp(rng.uniform(0, np.log(1000), classes))  # 1 : 1000 between classes
    truth = rng.multinomial(pixels, share / share.sum())
    groups = level_table(2, cmap)[ids]
    joint = np.zeros((N_L3, N_L3), np.int64)
    for j, n in zip(ids, truth, strict=True):  # the CDL's class j, mapped as ...
        kin = np.where(groups == groups[ids == j][0], 4.0, 1.0)  # errors mostly within L2
        kin[ids == j] = 0
        weights = 0.2 * kin / kin.sum()
        weights[ids == j] = 0.8
        joint[ids, j] += rng.multinomial(n, weights)
    parts = rng.dirichlet(np.ones(districts + 1), size=(N_L3, N_L3))  # (N_L3, N_L3, D + 1)
    domains = np.zeros((districts + 1, N_L3, N_L3), np.int64)
    for i, j in zip(*np.nonzero(joint), strict=True):
        domains[:, i, j] = rng.multinomial(joint[i, j], parts[i, j])
    names = ("outside", *(f"district {d}" for d in range(1, districts + 1)))
    return TestSplitCounts(joint, 0.01, ("synthetic",), domains, names)


def one_pass(pop: TestSplitCounts, cmap: object, settings: object) -> None:
    """One sample drawn and estimated at every level, as the check does per draw."""
    strata = level_table(settings.level, cmap)[:N_L3].astype(np.int64)
    n_strata = LEVEL_CLASSES[settings.level]
    sampler = StratifiedSampler(pop.joint, np.broadcast_to(strata[:, None], (N_L3, N_L3)),
                                n_strata, settings.n, settings.min_per_class)  # fmt: skip
    sample = sampler.draw(np.random.default_rng([settings.seed, 0])).ravel()
    m3, r3 = np.divmod(np.repeat(np.arange(sample.size), sample), N_L3)
    l3_px = pop.joint.sum(1)
    for level in (1, 2, 3):
        table = level_table(level, cmap)[:N_L3].astype(np.int64)
        joint = np.zeros((n_strata, LEVEL_CLASSES[level]), np.int64)
        np.add.at(joint, (strata, table), l3_px)
        estimate_at(level, settings.level, sampler.sizes, strata[m3], table[m3], table[r3],
                    pop.mapped_px(level, cmap), joint, settings.confidence)  # fmt: skip


def best(run: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs, seconds (the least disturbed by other load)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--pixels", type=int, default=5_000_000)
    parser.add_argument("--classes", type=int, default=40)
    parser.add_argument("--districts", type=int, default=3)
    parser.add_argument("--level", type=int, default=3, choices=(1, 2, 3))
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    cmap = load_class_map(CLASSES)
    settings = from_json(json.dumps({
        "confidence": 0.95, "draws": args.draws,
        "sample": {"n": args.n, "min_per_class": 20, "level": args.level, "seed": args.seed},
    }))  # fmt: skip
    pop = population(args.pixels, args.classes, args.districts, args.seed, cmap)
    cells = int((pop.domains > 0).sum())
    print(f"population: {pop.pixels} px, {int((pop.joint > 0).sum())} cells "
          f"({cells} over {len(pop.domains)} domains), design L{args.level}, n = {args.n}, "
          f"{args.draws} draws, best of {args.repeat}")  # fmt: skip
    once = best(lambda: one_pass(pop, cmap, settings), args.repeat)
    whole = best(lambda: check(pop, cmap, settings), args.repeat)
    by_district = best(lambda: check_districts(pop, cmap, settings, args.n), args.repeat)
    print(f"one pass (1 sample, 3 levels): {once * 1e3:8.1f} ms")
    for name, took in (("check", whole), ("check_districts", by_district)):
        print(f"{name:16s}: {took:6.3f} s, {took / args.draws * 1e3:6.2f} ms per draw, "
              f"{took / once:6.1f} x one pass")  # fmt: skip


if __name__ == "__main__":
    main()

"""Block-bootstrap benchmark: what the intervals add to evaluate.

Builds per-block confusion matrices of the real class counts (L1, L2, L3) for 1,000 blocks and
two weight sets (raw, ema), as evaluate holds them, and times
``emb.evaluation.block_scores.interval_record`` (every figure's interval, 1,000 resamples), best of
``--repeats``.

- bootstrap_s: seconds for all levels and both weight sets (goal < 2 s).
- per_level_set_s: bootstrap_s / 6.

Usage: ``python bench/bootstrap.py [--blocks 1000] [--resamples 1000] [--repeats 3]
[--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from emb.evaluation.block_scores import interval_record
from emb.evaluation.bootstrap import BootstrapSettings
from emb.metrics import NUM_CLASSES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    stacks = {
        w: {lv: rng.poisson(5.0, size=(args.blocks, n, n)).astype(np.int64)
            for lv, n in NUM_CLASSES.items()}
        for w in ("raw", "ema")
    }  # fmt: skip
    settings = BootstrapSettings(resamples=args.resamples)
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        interval_record(stacks, "ema", settings)
        best = min(best, time.perf_counter() - start)
    figures = {
        "blocks": args.blocks,
        "resamples": args.resamples,
        "classes": dict(NUM_CLASSES),
        "bootstrap_s": round(best, 3),
        "per_level_set_s": round(best / 6, 3),
    }
    print(json.dumps(figures))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=1)


if __name__ == "__main__":
    main()

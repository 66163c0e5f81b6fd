"""Stage: a run's training curves from its ``history.csv`` (loss per head, validation mIoU per
level and weight set, learning rate), as the report's figure."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from emb.report import plots


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--history", type=Path, required=True, help="results/runs/{run}/history.csv"
    )
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.history.is_file():
        raise SystemExit(f"error: run {args.run!r}: {args.history} not found (not trained?)")
    history = pd.read_csv(args.history)
    if history.empty:
        raise SystemExit(f"error: {args.history}: no epoch recorded yet")
    plots.save(plots.curves_figure(history, f"{args.run}: training"), args.out)


if __name__ == "__main__":
    main()

"""Stage: all runs side by side in ``results/summary.csv``, one row per run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from emb.io import atomic_path


def summarize(runs: list[str], metrics_paths: list[Path]) -> pd.DataFrame:
    rows = []
    for run, path in zip(runs, metrics_paths, strict=True):
        metrics = json.loads(path.read_text())
        rows.append({"run": run, **{k: v for k, v in metrics.items() if k != "split"}})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--metrics", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    table = summarize(args.runs, args.metrics)
    with atomic_path(args.out) as tmp:
        table.to_csv(tmp, index=False)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()

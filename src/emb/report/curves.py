"""Stage: a run's training curves from its ``history.csv`` (loss per head, validation mIoU per
level and weight set, learning rate), as the report's figure."""

from __future__ import annotations

import argparse
import errno
import logging
from pathlib import Path

import pandas as pd

from emb import plots, stage_runner

log = logging.getLogger(__name__)


class HistoryError(ValueError):
    """A ``history.csv`` that holds no epoch or is not a CSV table."""


def read_history(path: Path, run: str) -> pd.DataFrame:
    """The run's history, refused naming the file when missing, empty or unparsable."""
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, f"run {run!r} has no history (not trained?)", path)
    try:
        history = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise HistoryError(f"{path}: not a CSV table of epochs ({err})") from err
    if history.empty:
        raise HistoryError(f"{path}: no epoch recorded yet")
    return history


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--history", type=Path, required=True, help="results/runs/{run}/history.csv"
    )
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    history = read_history(args.history, args.run)
    plots.save(plots.curves_figure(history, f"{args.run}: training"), args.out)
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()

"""Stage: all runs side by side: ``summary.csv`` (one row per run), an HTML copy of the table
for the report, and ``summary.png`` (mIoU, macro-F1 and OA per level, grouped by run).

Columns: ``run``, ``weights`` (the weight set the figures belong to: ema or raw), the nine
``{miou,f1,oa}_{l1,l2,l3}`` figures, then ``raw_miou_l3`` / ``ema_miou_l3`` where present,
``epoch`` and ``samples``; then the provenance of the model (``git_commit``, ``git_dirty``,
library versions, ``config_digest``, ``manifest_digest``, ``host``, ``device`` of its training,
from the checkpoint) and ``evaluated_git_commit``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pandas as pd

from emb import cli
from emb.io import atomic_path
from emb.report import plots

log = logging.getLogger(__name__)
LEVELS = ("l1", "l2", "l3")
FIGURES = ("miou", "f1", "oa")
PROVENANCE_TITLE = "What made each run's model: code, libraries, config and data (digests)"
METRIC_COLUMNS = {"weights", "epoch", "samples"} | {f"{f}_{lv}" for f in FIGURES for lv in LEVELS}


def summary_row(run: str, metrics: dict) -> dict:
    """One run's row: the selected weights' figures, and L3 mIoU of each weight set."""
    row = {"run": run, "weights": metrics.get("weights", "raw")}
    row.update({f"{f}_{lv}": metrics[f"{f}_{lv}"] for lv in LEVELS for f in FIGURES})
    for name in metrics.get("weight_sets", []):
        row[f"{name}_miou_l3"] = metrics[name]["l3"]["miou"]
    row.update({k: metrics.get(k) for k in ("epoch", "samples")})
    row.update(metrics.get("trained_with", {}))  # what trained the model
    row["evaluated_git_commit"] = metrics.get("provenance", {}).get("git_commit")
    return row


def provenance_table(table: pd.DataFrame) -> pd.DataFrame:
    """The provenance columns of the summary, one row per run (the report's own section)."""
    return table[[c for c in table.columns if c not in METRIC_COLUMNS and "_miou_" not in c]]


def summarize(runs: list[str], metrics_paths: list[Path]) -> pd.DataFrame:
    rows = []
    for run, path in zip(runs, metrics_paths, strict=True):
        rows.append(summary_row(run, json.loads(Path(path).read_text())))
    return pd.DataFrame(rows)


@cli.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--metrics", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True, help="summary.csv")
    parser.add_argument("--html", type=Path, help="the table as HTML (for the report)")
    parser.add_argument("--png", type=Path, help="summary.png")
    parser.add_argument("--provenance", type=Path, help="the provenance table as HTML")
    args = parser.parse_args(argv)
    table = summarize(args.runs, args.metrics)
    with atomic_path(args.out) as tmp:
        table.to_csv(tmp, index=False)
    if args.html:
        with atomic_path(args.html) as tmp:
            tmp.write_text(
                plots.html_page("emb summary", [("Test-split metrics, all runs", table)])
            )
    if args.provenance:
        page = plots.html_page("emb provenance", [(PROVENANCE_TITLE, provenance_table(table))])
        with atomic_path(args.provenance) as tmp:
            tmp.write_text(page)
    if args.png:
        plots.save(plots.summary_figure(table), args.png)
    log.info(
        "wrote %s:\n%s", args.out, table[["run", *sorted(METRIC_COLUMNS)]].to_string(index=False)
    )


if __name__ == "__main__":
    main()

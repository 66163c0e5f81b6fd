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
SIDE_BY_SIDE_TITLE = "Validation (the one that chose best.pt) and test: one definition"
PROVENANCE_TITLE = "What made each run's model: code, libraries, config and data (digests)"
METRIC_COLUMNS = {"weights", "epoch", "samples"} | {
    f"{split}{f}_{lv}" for split in ("", "val_") for f in FIGURES for lv in LEVELS
}


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


def validation_at_best(history: Path, weights: str) -> dict[str, float]:
    """``val_{fig}_{level}`` of the validation that chose ``best.pt`` (the row with the best
    ``val_{weights}_miou_l3``, the selection figure), from the run's ``history.csv``."""
    table = pd.read_csv(history)
    select = f"val_{weights}_miou_l3"
    if table.empty or select not in table:
        return {}
    best = table.loc[table[select].idxmax()]
    return {f"val_{f}_{lv}": float(best[f"val_{weights}_{f}_{lv}"]) for lv in LEVELS
            for f in FIGURES}  # fmt: skip


def side_by_side(table: pd.DataFrame) -> pd.DataFrame:
    """Validation (at best.pt) and test figures per run and level, one definition for both."""
    rows = []
    for _, row in table.iterrows():
        for lv in LEVELS:
            figures = {}
            for f in FIGURES:
                figures[f"val_{f}"] = row.get(f"val_{f}_{lv}")  # the validation that chose best.pt
                figures[f"test_{f}"] = row.get(f"{f}_{lv}")
            rows.append({"run": row["run"], "level": lv, **figures})
    return pd.DataFrame(rows)


def summarize(
    runs: list[str], metrics_paths: list[Path], histories: list[Path] | None = None
) -> pd.DataFrame:
    rows = []
    for i, (run, path) in enumerate(zip(runs, metrics_paths, strict=True)):
        row = summary_row(run, json.loads(Path(path).read_text()))
        if histories and Path(histories[i]).is_file():
            row.update(validation_at_best(Path(histories[i]), row["weights"]))
        rows.append(row)
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
    parser.add_argument("--histories", type=Path, nargs="+", help="history.csv of each run")
    args = parser.parse_args(argv)
    table = summarize(args.runs, args.metrics, args.histories)
    with atomic_path(args.out) as tmp:
        table.to_csv(tmp, index=False)
    if args.html:
        tables = [("Test-split metrics, all runs", table),
                  (SIDE_BY_SIDE_TITLE, side_by_side(table))]  # fmt: skip
        with atomic_path(args.html) as tmp:
            tmp.write_text(plots.html_page("emb summary", tables))
    if args.provenance:
        page = plots.html_page("emb provenance", [(PROVENANCE_TITLE, provenance_table(table))])
        with atomic_path(args.provenance) as tmp:
            tmp.write_text(page)
    if args.png:
        plots.save(plots.summary_figure(table), args.png)
    shown = table[["run", *sorted(METRIC_COLUMNS & set(table.columns))]]
    log.info("wrote %s:\n%s", args.out, shown.to_string(index=False))


if __name__ == "__main__":
    main()

"""Stage: all runs side by side: ``summary.csv`` (one row per run), an HTML copy of the table
for the report, and ``summary.png`` (mIoU, macro-F1 and OA per level, grouped by run).

Columns: ``run``, ``weights`` (the weight set the figures belong to: ema or raw), the nine
``{miou,f1,oa}_{l1,l2,l3}`` figures each with its 95% block-bootstrap interval
(``_lo``/``_hi``) and ``blocks`` (test blocks it resampled), then ``raw_miou_l3`` /
``ema_miou_l3`` where present, ``epoch`` and ``samples``; then the provenance of the model
(``git_commit``, ``git_dirty``, library versions, ``config_digest``, ``manifest_digest``,
``host``, ``device`` of its training, from the checkpoint) and ``evaluated_git_commit``.

``pairs.csv`` (and the top of the HTML page): the standard paired comparisons, TESSERA - AEF
per architecture and SegFormer - DeepLab per source, each difference with the interval of a
bootstrap that draws the same test blocks for both runs (:mod:`emb.evaluation.bootstrap`),
and a plain sentence; runs that share no test block are not paired, and the row says why.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pandas as pd

from emb import cli
from emb.evaluation.bootstrap import BootstrapSettings, paired_difference, verdict
from emb.io import atomic_path
from emb.report import plots

log = logging.getLogger(__name__)
LEVELS = ("l1", "l2", "l3")
FIGURES = ("miou", "f1", "oa")
SIDE_BY_SIDE_TITLE = "Validation (the one that chose best.pt) and test: one definition"
PROVENANCE_TITLE = "What made each run's model: code, libraries, config and data (digests)"
METRIC_COLUMNS = (
    {"weights", "epoch", "samples", "blocks"}
    | {f"{split}{f}_{lv}" for split in ("", "val_") for f in FIGURES for lv in LEVELS}
    | {f"{f}_{lv}_{e}" for f in FIGURES for lv in LEVELS for e in ("lo", "hi")}
)
PAIRS_TITLE = "Paired comparisons (same test blocks resampled for both runs, 95% intervals)"
SOURCE_NAMES = {"aef": "AEF", "tessera": "TESSERA"}
ARCH_NAMES = {"segformer": "SegFormer", "deeplab": "DeepLab"}
FIGURE_NAMES = {"miou": "mIoU", "f1": "macro F1", "oa": "OA"}


def standard_pairs(metas: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(label, run a, run b) for b - a: TESSERA - AEF per architecture, SegFormer - DeepLab
    per source (runs named by the ``source``/``arch`` their metrics.json records)."""
    by = {(m.get("source"), m.get("arch")): run for run, m in metas.items()}
    pairs = []
    for arch, arch_name in ARCH_NAMES.items():
        if ("aef", arch) in by and ("tessera", arch) in by:
            pairs.append((f"TESSERA - AEF ({arch_name})", by["aef", arch], by["tessera", arch]))
    for source, source_name in SOURCE_NAMES.items():
        if (source, "deeplab") in by and (source, "segformer") in by:
            label = f"SegFormer - DeepLab ({source_name})"
            pairs.append((label, by[source, "deeplab"], by[source, "segformer"]))
    return pairs


def paired_comparisons(metas: dict[str, dict], blocks: dict[str, Path]) -> pd.DataFrame:
    """One row per (pair, level, figure): difference, interval, shared blocks, a sentence; or
    one row per pair that cannot be compared, saying why."""
    from emb.evaluation.block_scores import read_blocks

    rows = []
    for label, a, b in standard_pairs(metas):
        ma, mb = metas[a], metas[b]
        boot = ma.get("bootstrap") or {}
        why = None
        if not boot or not blocks.get(a) or not blocks.get(b):
            why = "no per-block matrices (evaluated before blocks.npz existed): re-run evaluate"
        if why is None:
            settings = BootstrapSettings(
                **{k: boot[k] for k in ("resamples", "seed", "level", "min_blocks") if k in boot}
            )
            for lv in LEVELS:
                pa = read_blocks(blocks[a], ma["weights"], lv)
                pb = read_blocks(blocks[b], mb["weights"], lv)
                diff = paired_difference(pa, pb, settings)
                if diff is None:
                    why = (
                        f"no test block in common ({len(pa)} vs {len(pb)} blocks, other ground):"
                        " their figures come from different places and are not paired"
                    )
                    break
                for f in FIGURES:
                    text = verdict(f"{label} {FIGURE_NAMES[f]} {lv.upper()}", f, diff)
                    rows.append({
                        "pair": label, "a": a, "b": b, "level": lv, "figure": f,
                        "difference": diff[f], "lo": diff[f"{f}_lo"], "hi": diff[f"{f}_hi"],
                        "blocks": diff["blocks"], "reliable": diff["reliable"], "sentence": text,
                    })  # fmt: skip
        if why is not None:
            rows = [r for r in rows if r["pair"] != label]
            rows.append({"pair": label, "a": a, "b": b, "sentence": f"{label}: not paired: {why}"})
    columns = ["pair", "a", "b", "level", "figure", "difference", "lo", "hi", "blocks",
               "reliable", "sentence"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def summary_row(run: str, metrics: dict) -> dict:
    """One run's row: the selected weights' figures, and L3 mIoU of each weight set."""
    row = {"run": run, "weights": metrics.get("weights", "raw")}
    for lv in LEVELS:
        for f in FIGURES:
            row[f"{f}_{lv}"] = metrics[f"{f}_{lv}"]
            for end in ("lo", "hi"):
                row[f"{f}_{lv}_{end}"] = metrics.get(f"{f}_{lv}_{end}")
    row["blocks"] = metrics.get("bootstrap", {}).get("blocks")
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


def split_support(metas: dict[str, dict], pairs: pd.DataFrame) -> pd.DataFrame:
    """In words, per run and per pair: whether the test split has enough blocks to judge."""
    rows = []
    for run, m in metas.items():
        boot = m.get("bootstrap") or {}
        rows.append({"what": run, "note": boot.get("note", "no intervals (re-run evaluate)")})
    for label, part in pairs.groupby("pair", sort=False):
        if part["level"].isna().all():
            rows.append({"what": label, "note": part["sentence"].iloc[0]})
            continue
        n = int(part["blocks"].iloc[0])
        ok = bool(part["reliable"].iloc[0])
        told = part[(part["lo"] > 0) | (part["hi"] < 0)]
        apart = ", ".join(
            f"{FIGURE_NAMES[f]} {lv.upper()}"
            for f, lv in zip(told["figure"], told["level"], strict=True)
        )
        note = (
            f"{n} shared test blocks: "
            + ("enough for an interval; " if ok else "too few for a reliable interval; ")
            + (f"distinguishable on {apart}" if apart else "no figure is distinguishable")
        )
        rows.append({"what": label, "note": note})
    return pd.DataFrame(rows, columns=["what", "note"])


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
    parser.add_argument("--pairs", type=Path, help="pairs.csv (the paired comparisons)")
    args = parser.parse_args(argv)
    table = summarize(args.runs, args.metrics, args.histories)
    with atomic_path(args.out) as tmp:
        table.to_csv(tmp, index=False)
    metas = {
        r: json.loads(Path(p).read_text()) for r, p in zip(args.runs, args.metrics, strict=True)
    }
    blocks = {
        r: Path(p).parent / "blocks.npz" for r, p in zip(args.runs, args.metrics, strict=True)
    }
    blocks = {r: p for r, p in blocks.items() if p.is_file()}
    pairs = paired_comparisons(metas, blocks)
    if args.pairs:
        with atomic_path(args.pairs) as tmp:
            pairs.to_csv(tmp, index=False)
    for sentence in pairs["sentence"]:
        log.info("%s", sentence)
    if args.html:
        tables = [(PAIRS_TITLE, pairs[["sentence", "blocks"]]),
                  ("What this test split can support", split_support(metas, pairs)),
                  ("Test-split metrics, all runs", table),
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

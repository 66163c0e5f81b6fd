"""Stage: all runs side by side: ``summary.csv`` (one row per run), ``summary.html`` (the page a
reader opens first), ``summary.png`` (mIoU, macro-F1 and OA per level, grouped by run),
``pairs.csv`` and ``pairs.png`` (the paired differences as a forest plot).

Columns of summary.csv: ``run``, ``weights`` (the weight set the figures belong to: ema or
raw), the nine ``{miou,f1,oa}_{l1,l2,l3}`` figures each with its 95% block-bootstrap interval
(``_lo``/``_hi``, empty where the run has too few test blocks for one) and ``blocks`` (test
blocks it resampled), then ``raw_miou_l3`` / ``ema_miou_l3`` where present, ``epoch`` and
``samples``; then the provenance of the model (``git_commit``, ``git_dirty``, library
versions, ``config_digest``, ``manifest_digest``, ``host``, ``device`` of its training, from
the checkpoint) and ``evaluated_git_commit``.

``pairs.csv``: the standard paired comparisons, TESSERA - AEF per architecture and SegFormer -
DeepLab per source, each difference with the interval of a bootstrap that draws the same test
blocks for both runs (:mod:`emb.evaluation.bootstrap`, which also decides when there are too few
blocks for an interval and a verdict), the ``verdict`` and a plain sentence; runs that share no
test block are not paired, and the row says why.

The HTML page leads with what the test split can support (stated once), then the runs (one row
per run, each cell "0.886 [0.848, 0.931]"), then the forest plot and a compact table of the
pairs, then validation against test.
"""

from __future__ import annotations

import argparse
import base64
import html
import logging
import math
from pathlib import Path

import pandas as pd

from emb import plots, stage_runner
from emb.estimation.settings import AreaSettings, add_option, from_json, parsed_option
from emb.evaluation.bootstrap import (
    DIGITS,
    FEW_BLOCKS_WHY,
    NO_VERDICT,
    BootstrapSettings,
    enough_blocks,
    paired_difference,
    verdict,
    verdict_of,
)
from emb.io import atomic_path, read_json
from emb.report.estimates_section import area_section

log = logging.getLogger(__name__)
LEVELS = ("l1", "l2", "l3")
FIGURES = ("miou", "f1", "oa")
HEADLINE_ORDER = ("miou", "oa", "f1")  # the runs table: mIoU first, then OA and macro F1
SIDE_BY_SIDE_TITLE = "Validation (the one that chose best.pt) and test: one definition"
PROVENANCE_TITLE = "What made each run's model: code, libraries, config and data (digests)"
METRIC_COLUMNS = (
    {"weights", "epoch", "samples", "blocks"}
    | {f"{split}{f}_{lv}" for split in ("", "val_") for f in FIGURES for lv in LEVELS}
    | {f"{f}_{lv}_{e}" for f in FIGURES for lv in LEVELS for e in ("lo", "hi")}
)
RUNS_TITLE = "Test split, all runs"
PAIRS_TITLE = "Paired differences (b - a, the same test blocks resampled for both runs)"
CAVEATS_TITLE = "What this test split can support"
SOURCE_NAMES = {"aef": "AEF", "tessera": "TESSERA"}
ARCH_NAMES = {"segformer": "SegFormer", "deeplab": "DeepLab"}
FIGURE_NAMES = {"miou": "mIoU", "f1": "macro F1", "oa": "OA"}
PAIR_COLUMNS = ["pair", "a", "b", "level", "figure", "difference", "lo", "hi", "blocks",
                "reliable", "verdict", "sentence"]  # fmt: skip


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


class MetricsError(ValueError):
    """A metrics.json the summary cannot use: one line naming it (exit code 2)."""


def read_metrics(path: Path) -> dict:
    """A run's metrics.json, parsed and its bootstrap settings checked: a file cut short, or
    a level outside (0, 1), is refused here in one line naming the file, not later without
    it."""
    fix = "rerun its evaluate job (snakemake --forcerun evaluate)"
    metrics = read_json(path, "JSON metrics file of an evaluate job", fix)
    if not isinstance(metrics, dict):
        raise MetricsError(f"{path}: expected a JSON object of figures, found "
                           f"{type(metrics).__name__}; {fix}")  # fmt: skip
    try:
        settings_of(metrics)
    except (TypeError, ValueError) as err:
        raise MetricsError(f"{path}: bootstrap: {err}") from None
    return metrics


def settings_of(metrics: dict) -> BootstrapSettings:
    """The bootstrap a run's intervals were drawn with (resamples, seed, level from its
    metrics.json); the block floor is always this code's (:func:`enough_blocks`)."""
    boot = metrics.get("bootstrap") or {}
    return BootstrapSettings(**{k: boot[k] for k in ("resamples", "seed", "level") if k in boot})


def paired_comparisons(metas: dict[str, dict], blocks: dict[str, Path]) -> pd.DataFrame:
    """One row per (pair, level, figure): difference, interval (none below the block floor),
    shared blocks, verdict, a sentence; or one row per pair that cannot be compared, saying
    why."""
    from emb.evaluation.block_scores import read_blocks

    rows = []
    for label, a, b in standard_pairs(metas):
        ma, mb = metas[a], metas[b]
        why = None
        if not ma.get("bootstrap") or not blocks.get(a) or not blocks.get(b):
            why = "no per-block matrices (evaluated before blocks.npz existed): re-run evaluate"
        if why is None:
            settings = settings_of(ma)
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
                    text = verdict(f"{label} {FIGURE_NAMES[f]} {lv.upper()}", f, diff, settings)
                    rows.append({
                        "pair": label, "a": a, "b": b, "level": lv, "figure": f,
                        "difference": diff[f], "lo": diff[f"{f}_lo"], "hi": diff[f"{f}_hi"],
                        "blocks": diff["blocks"], "reliable": diff["reliable"],
                        "verdict": verdict_of(diff, f), "sentence": text,
                    })  # fmt: skip
        if why is not None:
            rows = [r for r in rows if r["pair"] != label]
            rows.append({"pair": label, "a": a, "b": b, "verdict": NO_VERDICT,
                         "sentence": f"{label}: not paired: {why}"})  # fmt: skip
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def summary_row(run: str, metrics: dict) -> dict:
    """One run's row: the selected weights' figures with their intervals (none where the run
    has too few test blocks, whatever an older metrics.json holds), and L3 mIoU of each weight
    set."""
    row = {"run": run, "weights": metrics.get("weights", "raw")}
    blocks = (metrics.get("bootstrap") or {}).get("blocks")
    enough = blocks is not None and enough_blocks(int(blocks), settings_of(metrics))
    for lv in LEVELS:
        for f in FIGURES:
            row[f"{f}_{lv}"] = metrics[f"{f}_{lv}"]
            for end in ("lo", "hi"):
                row[f"{f}_{lv}_{end}"] = metrics.get(f"{f}_{lv}_{end}") if enough else None
    row["blocks"] = blocks
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


def _number(value: object) -> float | None:
    """A finite float, or None (a missing bound: None, NaN or an empty CSV cell)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def interval_text(value: object, lo: object, hi: object, signed: bool = False) -> str:
    """ "0.886 [0.848, 0.931]" (signed: "+0.012 [-0.004, +0.030]"); the figure alone where
    there is no interval."""
    sign = "+" if signed else ""
    v, lo_, hi_ = _number(value), _number(lo), _number(hi)
    if v is None:
        return ""
    text = f"{v:{sign}.{DIGITS}f}"
    if lo_ is None or hi_ is None:
        return text
    return f"{text} [{lo_:{sign}.{DIGITS}f}, {hi_:{sign}.{DIGITS}f}]"


def runs_cells(table: pd.DataFrame) -> pd.DataFrame:
    """The runs table a reader came for: run, weights, test blocks, then mIoU, OA and macro F1
    per level, each cell "0.886 [0.848, 0.931]" (the bounds and every other column stay in
    summary.csv)."""
    out = table[["run", "weights", "blocks"]].copy()
    for f in HEADLINE_ORDER:
        for lv in LEVELS:
            out[f"{FIGURE_NAMES[f]} {lv.upper()}"] = [
                interval_text(r[f"{f}_{lv}"], r.get(f"{f}_{lv}_lo"), r.get(f"{f}_{lv}_hi"))
                for _, r in table.iterrows()
            ]
    out["blocks"] = [("" if _number(b) is None else str(int(b))) for b in out["blocks"]]
    return out


def pair_cells(pairs: pd.DataFrame, figure: str = "miou") -> pd.DataFrame:
    """The compact pair table: pair, level, difference [lo, hi] of ``figure``, verdict (with
    the shared blocks where there is no verdict); a pair that was not paired says why."""
    rows = []
    for _, r in pairs.iterrows():
        if pd.isna(r["level"]):
            rows.append({"pair": r["pair"], "level": "", "difference": "",
                         "verdict": str(r["sentence"]).split(": not paired: ", 1)[-1]})  # fmt: skip
            continue
        if r["figure"] != figure:
            continue
        word = r["verdict"]
        if word == NO_VERDICT:
            word = f"{NO_VERDICT} ({int(r['blocks'])} shared blocks)"
        rows.append({"pair": r["pair"], "level": str(r["level"]).upper(),
                     "difference": interval_text(r["difference"], r["lo"], r["hi"], signed=True),
                     "verdict": word})  # fmt: skip
    name = f"{FIGURE_NAMES[figure]} difference [95% interval]"
    frame = pd.DataFrame(rows, columns=["pair", "level", "difference", "verdict"])
    return frame.rename(columns={"difference": name})


def caveats(table: pd.DataFrame, metas: dict[str, dict], pairs: pd.DataFrame) -> list[str]:
    """What the test split can support, said once: how intervals are made, the block floor
    and why, the blocks of each run and of each pair."""
    settings = settings_of(next(iter(metas.values()))) if metas else BootstrapSettings()
    lines = [
        f"Intervals: {settings.level:.0%} percentile intervals of a bootstrap over the test "
        f"split's spatial blocks ({settings.resamples} resamples), never over tiles; a "
        "difference is distinguishable only when its interval excludes 0.",
        f"Below {settings.min_blocks} blocks no interval and no verdict is given, because "
        f"{FEW_BLOCKS_WHY}: such a run shows its figure alone, such a pair its difference alone.",
    ]
    per_run = [f"{r} {b}" for r, b in zip(table["run"], runs_cells(table)["blocks"], strict=True)]
    lines.append("Test blocks per run: " + ", ".join(per_run) + ".")
    shared, apart = [], []
    for label, part in pairs.groupby("pair", sort=False):
        if part["level"].isna().all():
            apart.append(f"{label} ({part['sentence'].iloc[0].split(': not paired: ', 1)[-1]})")
        else:
            shared.append(f"{label} {int(part['blocks'].iloc[0])}")
    if shared:
        lines.append("Shared test blocks per pair: " + ", ".join(shared) + ".")
    if apart:
        lines.append("Not paired: " + "; ".join(apart) + ".")
    return lines


def summary_page(
    table: pd.DataFrame, metas: dict[str, dict], pairs: pd.DataFrame, forest_png: bytes | None,
    areas: dict[str, Path] | None = None, area_settings: AreaSettings | None = None,
    district_layers: dict[str, Path] | None = None,
) -> str:  # fmt: skip
    """summary.html: caveats once, the runs table, each run's crop areas (``areas``: run ->
    its area table, at ``area_settings``' level: the schema's when None; ``district_layers``:
    run -> its district layer, mapped on the page), the forest plot and
    the compact pair table, validation against test; self-contained (the plots inline),
    readable at 1400 px."""
    notes = "".join(f"<li>{html.escape(line)}</li>" for line in caveats(table, metas, pairs))
    forest = ""
    if forest_png is not None:
        data = base64.b64encode(forest_png).decode()
        forest = (f"<img id='forest' alt='paired differences (forest plot)' "
                  f"src='data:image/png;base64,{data}'>")  # fmt: skip
    sections = [
        (CAVEATS_TITLE, f"<ul class='caveats'>{notes}</ul>"),
        (RUNS_TITLE, plots.html_table(runs_cells(table), "runs", grouped=True)),
        *([area_section(areas, area_settings or from_json("{}"), layers=district_layers)]
          if areas else []),
        (PAIRS_TITLE, forest + plots.html_table(pair_cells(pairs), "pairs")
         + "<p>OA and macro-F1 differences: <code>pairs.csv</code>; every column of every run: "
         "<code>summary.csv</code>.</p>"),
        (SIDE_BY_SIDE_TITLE, plots.html_table(side_by_side(table), "side-by-side")),
    ]  # fmt: skip
    return plots.html_sections("emb summary", sections)


def summarize(
    runs: list[str], metrics_paths: list[Path], histories: list[Path] | None = None
) -> pd.DataFrame:
    rows = []
    for i, (run, path) in enumerate(zip(runs, metrics_paths, strict=True)):
        row = summary_row(run, read_metrics(Path(path)))
        if histories and Path(histories[i]).is_file():
            row.update(validation_at_best(Path(histories[i]), row["weights"]))
        rows.append(row)
    return pd.DataFrame(rows)


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--metrics", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True, help="summary.csv")
    parser.add_argument("--html", type=Path, help="summary.html (the page; the report shows it)")
    parser.add_argument("--png", type=Path, help="summary.png")
    parser.add_argument("--provenance", type=Path, help="the provenance table as HTML")
    parser.add_argument("--histories", type=Path, nargs="+", help="history.csv of each run")
    parser.add_argument("--pairs", type=Path, help="pairs.csv (the paired comparisons)")
    parser.add_argument("--pairs-png", type=Path, help="pairs.png (the forest plot)")
    parser.add_argument("--areas", type=Path, nargs="+",
                        help="each run's area table, in --runs' order")  # fmt: skip
    parser.add_argument("--district-layers", type=Path, nargs="*",
                        help="each run's district layer, in --runs' order")  # fmt: skip
    add_option(parser, "--area-settings")
    args = parser.parse_args(argv)
    for flag, given in (("--areas", args.areas), ("--district-layers", args.district_layers)):
        if given and len(given) != len(args.runs):
            parser.error(f"{flag}: expected one per run ({len(args.runs)}), found {len(given)}")
    area_settings = parsed_option(parser, args.area_settings, "--area-settings")
    table = summarize(args.runs, args.metrics, args.histories)
    with atomic_path(args.out) as tmp:
        table.to_csv(tmp, index=False)
    metas = {r: read_metrics(p) for r, p in zip(args.runs, args.metrics, strict=True)}
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
    forest_png = None
    if args.pairs_png or args.html:
        floor = BootstrapSettings().min_blocks
        forest_png = plots.png_bytes(plots.forest_figure(pairs, floor))
        if args.pairs_png:
            with atomic_path(args.pairs_png) as tmp:
                tmp.write_bytes(forest_png)
    if args.html:
        with atomic_path(args.html) as tmp:
            areas = dict(zip(args.runs, args.areas, strict=True)) if args.areas else None
            layers = dict(zip(args.runs, args.district_layers or [], strict=False))
            tmp.write_text(summary_page(table, metas, pairs, forest_png, areas, area_settings,
                                        layers))  # fmt: skip
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

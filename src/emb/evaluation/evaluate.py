"""Stage: evaluate a run's best checkpoint on the test split.

Both weight sets of the checkpoint are scored in one pass over the data: ``raw`` (the model as
trained) and, when the checkpoint holds one, ``ema`` (its moving average). Every figure comes
from an exact integer confusion matrix per level (rows = reference, columns = prediction;
pixels labelled 255 never count), stored in ``metrics.json`` so that anyone can recompute it.
The top-level ``miou_l3``, ``f1_l1``, ``oa_l2``, ... keys (what ``summary.csv`` shows) are
those of the weights ``ema.select_best_by`` chose the checkpoint by (raw without EMA).

Outputs: ``metrics.json``, ``per_class.csv`` (one row per weight set, level and class),
``confusion_l{1,2,3}.png`` (row-normalized), ``iou.png`` (per-class IoU bars) and
``blocks.npz`` (the same counts per spatial block: ``meta.json`` ``block``, else the tile).
Every figure gets a 95% interval from a bootstrap over those blocks
(:mod:`emb.evaluation.bootstrap`): ``miou_l3_lo``/``_hi`` next to ``miou_l3``, ``intervals``
per weight set, ``iou_lo``/``iou_hi`` in ``per_class.csv``, and ``bootstrap`` (settings,
number of blocks, and why there is no interval: below 10 blocks every bound is null).

Run under torchrun (the launcher, as training), every rank scores its own shards and the
confusion matrices are summed across ranks: exact integers, so the figures do not depend on the
number of processes. Rank 0 writes the outputs.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from emb import plots, stage_runner
from emb.classes import ClassMap, load_class_map
from emb.config_schema import config_default, config_option
from emb.evaluation.block_scores import (
    FIGURES,
    BlockCounts,
    block_stacks,
    interval_record,
    merge_blocks,
    write_blocks,
)
from emb.evaluation.bootstrap import BootstrapSettings, tile_blocks
from emb.evaluation.runs import LEVELS, RunError, TrainedRun, open_run
from emb.io import atomic_path, write_json
from emb.loading.batches import LoaderSpec, eval_batches
from emb.loading.shard_manifest import read_manifest, shard_sample_counts, shards_for_rank
from emb.loading.sidecar import index_shard
from emb.metrics import (
    NUM_CLASSES,
    empty_confusions,
    grouped_confusions,
    scores_from_confusion,
    sum_over_ranks,
    update,
)
from emb.models.runtime import CPU_HOST, Host, Runtime
from emb.progress import Progress
from emb.provenance import digest_file, provenance
from emb.training.loss import HierarchyTargets

# The stage's figures: row-normalized confusion matrices and per-class IoU bars.


def class_names(cmap: ClassMap) -> dict[str, tuple[str, ...]]:
    return {"l1": cmap.l1_names, "l2": cmap.l2_names, "l3": cmap.l3_names}


def write_figures(
    out_dir: Path, record: dict, table: pd.DataFrame, cms: dict[str, np.ndarray], cmap: ClassMap
) -> list[Path]:
    """``confusion_l{1,2,3}.png`` and ``iou.png`` of the selected weights into ``out_dir``."""
    names = class_names(cmap)
    written = []
    for level in LEVELS:
        title = (
            f"{record['run']} ({record['weights']} weights), {level.upper()}: "
            f"OA {record[f'oa_{level}']:.3f}, mIoU {record[f'miou_{level}']:.3f}"
        )
        path = out_dir / f"confusion_{level}.png"
        plots.save(plots.confusion_figure(cms[level], names[level], title), path)
        written.append(path)
    chosen = table[table["weights"] == record["weights"]]
    path = out_dir / "iou.png"
    plots.save(plots.iou_figure(chosen, f"{record['run']} ({record['weights']} weights)"), path)
    return [*written, path]


log = logging.getLogger(__name__)


@torch.no_grad()
def confusion_matrices(
    run: TrainedRun,
    shards: list[str],
    shard_samples: dict[str, int],
    cmap: ClassMap,
    batch_size: int,
    run_on: Runtime | None = None,
    rank: int = 0,
    world: int = 1,
    blocks: dict | None = None,
    tile_size: int | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """{weights: {level: (n, n) int64}} over every sample of ``shards``, read once, summed over
    the ``world`` ranks (each reads its own shards).

    When ``blocks`` is a dict it is filled with {block id: {weights: {level: (n, n)}}}: the
    same counts split by spatial block (:func:`emb.evaluation.bootstrap.tile_blocks`), for the
    block bootstrap. Eval batches come in the shards' file order, so the keys are known.
    """
    run_on = run_on or run.runtime(CPU_HOST)
    device = run_on.device
    dequantize = run.dequantize().to(device)
    targets_of = HierarchyTargets(cmap).to(device)
    models = {name: run_on.prepare(run.model(name)) for name in run.weights}
    cms = {name: empty_confusions(device) for name in models}
    loader = run.cfg.train  # the order's keys: unused, evaluation reads in the shards' order
    spec = LoaderSpec(run.cfg.data.source, run.cfg.model.in_dim, batch_size, 0,
                      loader.shuffle_buffer, loader.seed, tile_size=tile_size)  # fmt: skip
    mine = shards_for_rank(shards, rank, world)
    progress = Progress(sum(shard_samples[s] for s in mine), "tiles", f"{run.name} test", log)
    block_of = tile_blocks(mine) if blocks is not None else {}
    sample_blocks = [block_of.get(s.key, s.key) for url in mine for s in index_shard(url)] \
        if blocks is not None else []  # fmt: skip
    block_counts = BlockCounts(sample_blocks, list(models), device)
    # each sample's block row, on the device once: a batch takes a slice, no copy per batch
    rows = to_device(torch.tensor([block_counts.index[b] for b in sample_blocks],
                                  dtype=torch.int64), device)  # fmt: skip
    start = 0
    for batch in eval_batches(shards, spec, rank, world, shard_samples):
        size = len(batch["emb"])
        progress.advance(size)
        batch_rows, start = rows[start : start + size], start + size
        x, y = dequantize({k: to_device(v, device) for k, v in batch.items()})
        x, targets = run_on.inputs(x), targets_of(y)
        for name, model in models.items():
            with run_on.autocast():
                logits = model(x)
            update(cms[name], logits, targets)
            if blocks is not None:
                add_block_counts(block_counts, name, batch_rows, logits, targets)
    progress.done()
    if blocks is not None:
        merge_blocks(blocks, block_counts.as_dict())
    return {name: sum_over_ranks(per_level) for name, per_level in cms.items()}


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without the host waiting for the device: a copy from pageable
    memory waits for every queued kernel, so on a GPU the batch is pinned first."""
    if device.type == "cuda" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def add_block_counts(
    counts: BlockCounts, weights: str, rows: torch.Tensor, logits: dict, targets: dict
) -> None:
    """A batch into ``counts`` by its samples' block ``rows`` (a device tensor): what
    ``BlockCounts.add`` does, without building and copying the rows from host ids per batch."""
    for lv, n in NUM_CLASSES.items():
        counts.counts[weights][lv] += grouped_confusions(
            logits[lv].argmax(1), targets[lv], n, rows, len(counts.ids)
        )


def metrics_record(cms: dict[str, dict[str, np.ndarray]], selected: str) -> dict:
    """metrics.json content: top-level figures of ``selected``, then every weight set in full."""
    record: dict = {"weights": selected, "weight_sets": list(cms)}
    per_set = {}
    for name, levels in cms.items():
        per_set[name] = {}
        for level, cm in levels.items():
            s = scores_from_confusion(cm)
            per_set[name][level] = {
                **{k: s[k] for k in (*FIGURES, "classes_present", "pixels")},
                "confusion": cm.tolist(),
            }
    for level in LEVELS:
        for fig in FIGURES:
            record[f"{fig}_{level}"] = per_set[selected][level][fig]
    record.update(per_set)
    return record


def per_class_table(
    cms: dict[str, dict[str, np.ndarray]], cmap: ClassMap, intervals: dict | None = None
) -> pd.DataFrame:
    """One row per (weights, level, class): support, predicted, IoU (with ``iou_lo``/``iou_hi``
    from ``intervals`` when given), F1, precision, recall."""
    names = class_names(cmap)
    parts = []
    for name, levels in cms.items():
        for level, cm in levels.items():
            pc = scores_from_confusion(cm)["per_class"]
            frame = pd.DataFrame(
                {
                    "weights": name,
                    "level": level,
                    "class_id": np.arange(cm.shape[0]),
                    "class_name": names[level],
                    "support": pc["support"],
                    "predicted": pc["predicted"],
                    **{k: pc[k] for k in ("iou", "f1", "precision", "recall")},
                }
            )
            if intervals is not None:
                iv = intervals[name][level]
                frame.insert(frame.columns.get_loc("iou") + 1, "iou_lo", iv["iou_lo"])
                frame.insert(frame.columns.get_loc("iou") + 2, "iou_hi", iv["iou_hi"])
            parts.append(frame)
    return pd.concat(parts, ignore_index=True)


def evaluate(
    run_dir: Path,
    classes: Path | str,
    split: str = "test",
    checkpoint_name: str = "best.pt",
    batch_size: int | None = None,
    run_on: Runtime | None = None,
    rank: int = 0,
    world: int = 1,
    settings: BootstrapSettings | None = None,
) -> tuple[dict, pd.DataFrame, dict[str, np.ndarray]]:
    """Score a run's checkpoint on ``split`` of its manifest.

    ``batch_size``: samples per forward pass; None takes the config schema's
    ``predict.batch_size`` (windows per forward pass), stated there once.

    Returns (metrics.json record, per-class table, {level: confusion of the selected weights}).
    The record's ``_blocks`` (block ids, {weights: {level: (B, n, n)}}) is what
    :func:`write_blocks` stores; it is not part of metrics.json.
    """
    cmap = load_class_map(classes)
    run = open_run(run_dir, cmap, classes, checkpoint_name)
    run_on = run_on or run.runtime(CPU_HOST)
    if batch_size is None:
        batch_size = int(config_default("predict.batch_size"))
    manifest_path = Path(run.cfg.data.manifest)
    manifest = read_manifest(manifest_path, splits=(split,))
    run.check_in_dim(int(manifest["in_dim"]), str(manifest_path))
    part = manifest["splits"][split]
    blocks: dict = {}
    cms = confusion_matrices(
        run, part["shards"], shard_sample_counts(part), cmap, batch_size, run_on, rank, world,
        blocks, manifest.get("tile_size"),
    )  # fmt: skip
    empty = [lv for lv, cm in cms[run.selected].items() if cm.sum() == 0]
    if empty:
        raise RunError(f"{manifest_path}: split {split!r} has no labelled pixel to score")
    record = {
        "run": Path(run_dir).name,
        "checkpoint": str(run.path),
        "epoch": run.epoch,
        "split": split,
        "samples": part["samples"],
        "source": run.cfg.data.source,
        "arch": run.cfg.model.arch,
        **metrics_record(cms, run.selected),
        "provenance": provenance(
            config_digest=run.trained_with.get("config_digest"),
            manifest_digest=digest_file(manifest_path),
            stats_digest=run.stats_digest(),
            device=run_on.device,
        )
        | run_on.record(),  # the resolved precision and memory format it ran with
        "trained_with": run.trained_with,
    }
    settings = settings or BootstrapSettings()
    ids, stacks = block_stacks(blocks)
    # bounds (None below the block floor) and ``bootstrap`` (blocks, reliable, note): both
    # decided in emb.evaluation.bootstrap, the one place summary.csv and pairs.csv ask too
    intervals = interval_record(stacks, run.selected, settings)
    record.update({k: v for k, v in intervals.items() if k != "per_weights"})
    record["intervals"] = intervals["per_weights"]
    record["provenance"]["bootstrap"] = settings.record()
    table = per_class_table(cms, cmap, intervals["per_weights"])
    record["_blocks"] = (ids, stacks)
    return record, table, cms[run.selected]


def evaluate_ranks(
    args: argparse.Namespace, rank: int, world: int, host: Host
) -> tuple[dict, pd.DataFrame, dict[str, np.ndarray]]:
    """:func:`evaluate` on this rank's device (its runtime, resolved once here), in a process
    group when there are several."""
    cmap = load_class_map(args.classes)
    run = open_run(args.run_dir, cmap, args.classes, args.checkpoint)
    run_on = run.runtime(host)
    run_on.occupy(args.threads)
    if world > 1:
        backend = "nccl" if run_on.device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=run.cfg.train.collective_timeout_s)
        dist.init_process_group(backend, timeout=timeout)
    return evaluate(
        args.run_dir, args.classes, args.split, args.checkpoint, args.batch_size, run_on,
        rank, world, BootstrapSettings(resamples=args.resamples, seed=args.seed, level=args.level),
    )  # fmt: skip


def bounded(kind: type, least: int) -> Callable[[str], int]:
    """An argparse type: a ``kind`` number >= ``least``, refused in one line otherwise (the
    option is named by argparse)."""

    def parse(text: str) -> int:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least}, found {text!r}")
        return value

    return parse


def confidence_level(text: str) -> float:
    """An argparse type: a confidence level strictly between 0 and 1 (0.95 = 95%)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"expected a confidence level between 0 and 1 (e.g. 0.95), found {text!r}"
        )
    return value


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="results/runs/{run}")
    parser.add_argument("--checkpoint", default="best.pt", help="file name inside --run-dir")
    parser.add_argument("--classes", type=Path, required=True, help="classes.csv")
    parser.add_argument("--split", default="test", choices=["train", "val", "test"])
    parser.add_argument("--out-dir", type=Path, required=True, help="results/eval/{run}")
    parser.add_argument(
        "--batch-size", type=int, **config_option("predict.batch_size", "samples per forward")
    )
    parser.add_argument(
        "--threads", type=int, **config_option("launch.threads", "CPU threads per process")
    )
    parser.add_argument("--resamples", type=bounded(int, 1), default=1000,
                        help="block-bootstrap resamples (>= 1)")  # fmt: skip
    parser.add_argument("--seed", type=bounded(int, 0), default=0,
                        help="block-bootstrap seed (>= 0)")  # fmt: skip
    parser.add_argument("--level", type=confidence_level, default=0.95,
                        help="confidence level of the intervals, in (0, 1)")  # fmt: skip
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    try:
        record, table, cms = evaluate_ranks(args, rank, world, Host.here(os.environ))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank != 0:
        return
    ids, stacks = record.pop("_blocks")
    write_blocks(args.out_dir / "blocks.npz", ids, stacks)
    write_figures(args.out_dir, record, table, cms, load_class_map(args.classes))
    with atomic_path(args.out_dir / "per_class.csv") as tmp:
        table.to_csv(tmp, index=False)
    write_json(args.out_dir / "metrics.json", record)
    figures = {k: round(v, 4) for k, v in record.items() if isinstance(v, float)}
    log.info("wrote %s: %s", args.out_dir / "metrics.json", json.dumps(figures))


if __name__ == "__main__":
    main()

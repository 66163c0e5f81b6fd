"""Stage: evaluate a run's best checkpoint on the test split.

Writes ``metrics.json`` (mIoU, macro-F1, overall accuracy per level; torchmetrics) and
``per_class.csv`` (L3 IoU, F1 and support per class, from the confusion matrix).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from emb import checkpoint
from emb import metrics as level_metrics
from emb.classes import load_class_map
from emb.config import TrainConfig
from emb.data import Dequantize, LoaderSpec, eval_batches, shard_sample_counts
from emb.io import atomic_path, write_json
from emb.loss import HierarchyTargets
from emb.models import build_model


@torch.no_grad()
def evaluate(
    ckpt_path: Path, split: str = "test", batch_size: int = 16
) -> tuple[dict, pd.DataFrame]:
    """Metrics of the checkpoint's model on ``split`` of its manifest, and the L3 table."""
    state = checkpoint.load(ckpt_path)
    cfg = TrainConfig.from_dict(state["config"], f"{ckpt_path}: config")
    model = build_model(cfg.model)
    model.load_state_dict(state["model"])
    model.eval()
    manifest = json.loads(Path(cfg.data.manifest).read_text())
    stats = Path(cfg.data.stats_dir) if cfg.data.normalize and cfg.data.stats_dir else None
    prepare = Dequantize.from_stats(cfg.data.source, stats)
    cmap = load_class_map(cfg.data.classes)
    targets_of = HierarchyTargets(cmap)
    metrics = level_metrics.level_metrics(confusion=True)
    spec = LoaderSpec(cfg.data.source, cfg.model.in_dim, batch_size)
    part = manifest["splits"][split]
    for batch in eval_batches(part["shards"], spec, shard_samples=shard_sample_counts(part)):
        x, y = prepare(batch)
        level_metrics.update(metrics, model(x), targets_of(y))
    result = level_metrics.compute(metrics)
    result.update(split=split, samples=manifest["splits"][split]["samples"], epoch=state["epoch"])
    cm = metrics["l3"]["confusion"].compute().numpy().astype(np.int64)
    tp = np.diag(cm)
    fp, fn = cm.sum(0) - tp, cm.sum(1) - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        table = pd.DataFrame(
            {
                "l3_id": np.arange(len(tp)),
                "l3_name": cmap.l3_names,
                "support": cm.sum(1),
                "iou": tp / (tp + fp + fn),
                "f1": 2 * tp / (2 * tp + fp + fn),
            }
        )
    return result, table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--split", default="test", choices=["train", "val", "test"])
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument("--per-class", type=Path, required=True)
    args = parser.parse_args(argv)
    result, table = evaluate(args.checkpoint, args.split)
    write_json(args.metrics, result)
    with atomic_path(args.per_class) as tmp:
        table.to_csv(tmp, index=False)
    print(json.dumps({k: round(v, 4) for k, v in result.items() if isinstance(v, float)}))


if __name__ == "__main__":
    main()

"""Validation and test scores are one definition: the trainer's validation pass over the test
split gives the figures of metrics.json (same confusion matrices, same macro averages)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from conftest import CLASSES_CSV, TinyDemo
from training_runs import resolve_config, train_here

from emb.classes import load_class_map
from emb.evaluation.evaluate import evaluate
from emb.evaluation.runs import open_run
from emb.loading.batches import LoaderSpec, eval_batches
from emb.loading.shard_manifest import read_manifest, shard_sample_counts
from emb.metrics import FIGURES, scores_from_confusion
from emb.models.runtime import Runtime
from emb.training.loss import HierarchyTargets, MultiHeadLoss
from emb.training.trainer import Trainer

LEVELS = ("l1", "l2", "l3")


def test_validating_the_test_split_gives_the_figures_of_metrics_json(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    config = resolve_config(tiny_demo, tmp_path / "run", "train.epochs=2",
                            "train.precision=fp32")  # fmt: skip
    train_here(config)
    record, _, _ = evaluate(config.parent, CLASSES_CSV, split="test")

    cmap = load_class_map(CLASSES_CSV)
    run = open_run(config.parent, cmap, CLASSES_CSV)
    models = {name: run.model(name) for name in run.weights}
    first = next(iter(models.values()))
    optimizer = torch.optim.SGD(first.parameters(), lr=0.0)
    trainer = Trainer(
        first, MultiHeadLoss({"l1": 1.0, "l2": 1.0, "l3": 1.0}, run.cfg.loss.label_smoothing),
        HierarchyTargets(cmap),
        run.dequantize(), optimizer, torch.optim.lr_scheduler.ConstantLR(optimizer, 1.0),
        Runtime(torch.device("cpu"), "fp32", False, False, None), run.cfg.train, None,
    )  # fmt: skip
    test = read_manifest(Path(run.cfg.data.manifest), splits=("test",))["splits"]["test"]
    train = run.cfg.train
    spec = LoaderSpec(run.cfg.data.source, run.cfg.model.in_dim, 4, 0, train.shuffle_buffer,
                      train.seed)  # fmt: skip
    batches = eval_batches(test["shards"], spec, 0, 1, shard_sample_counts(test))

    # as the test evaluation runs: BatchNorm on its running statistics, every batch scored
    validated = trainer.validate(batches, models, bn_batch_stats=False, min_batch=1)

    assert set(record["weight_sets"]) == set(models)
    for name in models:
        for level in LEVELS:
            for fig in FIGURES:
                assert (
                    abs(validated[f"val_{name}_{fig}_{level}"] - record[name][level][fig]) <= 1e-9
                )
    # and the test figures are the confusion matrices' own (not re-derived elsewhere)
    cm = np.asarray(record[record["weights"]]["l3"]["confusion"])
    assert record["miou_l3"] == scores_from_confusion(cm)["miou"]
    assert validated["val_samples"] == test["samples"]

"""Run under torchrun by the training tests: validate one checkpoint on the val split with
WORLD_SIZE ranks (gloo) and write rank 0's figures as JSON. Usage: CKPT OUT [--as-trained].

By default the raw weights are validated in batches of 3 without the BatchNorm guards;
``--as-trained`` validates as the run's own validator did (its batch size, both weight sets,
``val_bn_batch_stats`` and ``val_min_batch``), so its figures can be held against history.csv.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from emb.classes import load_class_map
from emb.loading.batches import LoaderSpec, eval_batches
from emb.loading.dequantize import Dequantize
from emb.loading.shard_manifest import shard_sample_counts
from emb.models import build_model
from emb.models.runtime import Runtime
from emb.training import checkpoint_file
from emb.training.loss import HierarchyTargets, MultiHeadLoss
from emb.training.run_config import TrainConfig
from emb.training.trainer import Trainer


def main(ckpt: Path, out: Path, as_trained: bool = False) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    state = checkpoint_file.load(ckpt)
    cfg = TrainConfig.from_dict(state["config"])
    models = {}
    for name in ("ema", "raw") if as_trained and state.get("ema") is not None else ("raw",):
        models[name] = build_model(cfg.model)
        models[name].load_state_dict(state["ema" if name == "ema" else "model"])
    model = models["raw"]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model, MultiHeadLoss(cfg.loss.weights, cfg.loss.label_smoothing),
        HierarchyTargets(load_class_map(cfg.data.classes)), Dequantize(cfg.data.source),
        opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
        Runtime(torch.device("cpu"), "fp32", False, False, None), cfg.train, None,
    )  # fmt: skip
    val = json.loads(Path(cfg.data.manifest).read_text())["splits"]["val"]
    batch = cfg.train.batch_size if as_trained else 3
    spec = LoaderSpec(cfg.data.source, cfg.model.in_dim, batch, 0, cfg.train.shuffle_buffer,
                      cfg.train.seed)  # fmt: skip
    batches = eval_batches(val["shards"], spec, rank, world, shard_sample_counts(val))
    if as_trained:
        loop = cfg.train
        figures = trainer.validate(batches, models, loop.val_bn_batch_stats, loop.val_min_batch)
    else:
        # without the BatchNorm guards: running statistics, every batch scored
        figures = trainer.validate(batches, {"raw": model}, bn_batch_stats=False, min_batch=1)
    if rank == 0:
        out.write_text(json.dumps(figures))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), "--as-trained" in sys.argv[3:])

"""Small trained runs for the evaluation and prediction tests, built from the tiny demo.

A run folder as ``emb.training.train`` leaves it (``config.yaml``, ``best.pt`` with "model",
"config", "epoch" and optionally "ema"), with weights fitted for a few dozen steps by a plain
loop on the demo's train shards through the real loader, ``Dequantize`` and hierarchy targets:
enough for the model to have learned the fields, in seconds on a CPU.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from conftest import CLASSES_CSV, REPO, TinyDemo

from emb.classes import load_class_map
from emb.loading.batches import LoaderSpec, train_batches
from emb.loading.dequantize import Dequantize
from emb.loading.shard_manifest import shard_sample_counts
from emb.models import ModelConfig, build_model
from emb.prep.channel_stats import main as channel_stats_main
from emb.training import checkpoint_file
from emb.training.loss import HierarchyTargets
from emb.training.run_config import TrainConfig
from emb.training.train_config import resolve

SMALL_MODEL = {"widths": [8, 16, 16, 32], "depths": [1, 1, 1, 1], "decoder_dim": 16}


def resolved_config(demo: TinyDemo, root: Path, source: str, arch: str) -> dict:
    """The run config the workflow would resolve for ``{source}_{arch}`` on the tiny demo."""
    files = [REPO / "config/train/defaults.yaml", REPO / f"config/train/{source}_{arch}.yaml",
             REPO / "config/train/demo.yaml"]  # fmt: skip
    overrides = [
        f"data.manifest={demo.manifests[source]}",
        f"data.classes={CLASSES_CSV}",
        f"model.widths={SMALL_MODEL['widths']}",
        f"model.depths={SMALL_MODEL['depths']}",
        f"model.decoder_dim={SMALL_MODEL['decoder_dim']}",
    ]
    if source == "tessera":
        stats = root / "stats" / source
        if not (stats / "channel_mean.npy").exists():
            channel_stats_main(["--manifest", str(demo.manifests[source]), "--out-dir", str(stats)])
        overrides.append(f"data.stats_dir={stats}")
    config = resolve(files, overrides, REPO / "workflow/schemas/train.schema.yaml")
    model = ModelConfig(**config["model"]).for_tile(demo.manifest(source)["tile_size"])
    if model.aspp_rates is not None:  # DeepLab: the rates training records (loop.build_config)
        config["model"]["aspp_rates"] = list(model.aspp_rates)
    return config


def fit(config: dict, steps: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Weights after ``steps`` Adam steps on L3 cross-entropy, and after half of them."""
    cfg = TrainConfig.from_dict(config)
    torch.manual_seed(seed)
    model = build_model(cfg.model)
    data = cfg.data
    stats = Path(data.stats_dir) if data.normalize and data.stats_dir else None
    prepare = Dequantize.from_stats(data.source, stats)
    targets = HierarchyTargets(load_class_map(data.classes))
    manifest = json.loads(Path(data.manifest).read_text())
    train = manifest["splits"]["train"]
    spec = LoaderSpec(data.source, cfg.model.in_dim, 8, 0, cfg.train.shuffle_buffer, seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    snapshots = []
    step, epoch = 0, 0
    while step < steps:
        for batch in train_batches(train["shards"], train["samples"], spec, 0, 1, epoch,
                                   shard_samples=shard_sample_counts(train)):  # fmt: skip
            x, y = prepare(batch)
            logits = model(x)
            t = targets(y)
            loss = sum(F.cross_entropy(logits[lv], t[lv], ignore_index=255) for lv in t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == steps // 2:
                snapshots.append(copy.deepcopy(model.state_dict()))
            if step >= steps:
                break
        epoch += 1
    model.eval()
    return [model.state_dict(), *snapshots]


def write_run(
    run_dir: Path, config: dict, model: dict, ema: dict | None = None,
    tile_size: int | None = None,
) -> Path:  # fmt: skip
    """A run folder with ``config.yaml`` and ``best.pt`` in the trainer's checkpoint format
    (with ``tile_size``, the training tile side, where given: training records it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    state = {"model": model, "config": config, "epoch": 3, "ema": ema}
    if tile_size is not None:
        state["tile_size"] = tile_size
    checkpoint_file.save(run_dir / "best.pt", state)
    return run_dir


def tiny_run(
    demo: TinyDemo, root: Path, source: str = "aef", arch: str = "segformer", steps: int = 80,
    with_ema: bool = False,
) -> Path:  # fmt: skip
    """Resolve, fit and write a run; with ``with_ema`` the half-way weights play the EMA."""
    config = resolved_config(demo, root, source, arch)
    final, half = fit(config, steps)
    return write_run(root / "runs" / f"{source}_{arch}", config, final, half if with_ema else None,
                     demo.manifest(source)["tile_size"])  # fmt: skip

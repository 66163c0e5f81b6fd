"""A trained run as evaluation and prediction see it: its checkpoint, config and weight sets.

Loading goes through :func:`~emb.training.checkpoint_file.load` only. The weight sets are ``raw``
(the model as trained) and, when the checkpoint holds one, ``ema`` (its moving average); the
run's best checkpoint stands for the set its run selected it by (``ema.select_best_by``: EMA
unless ``raw``, and raw without EMA weights), and evaluation, prediction and the summary report
that set. Every mismatch between checkpoint, data and class table is an error naming the file,
the expected and the found value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from torch import nn

from emb.classes import ClassMap
from emb.loading.dequantize import Dequantize
from emb.models import build_model
from emb.models.runtime import Host, Runtime
from emb.provenance import UNKNOWN, digest_file, digest_stats
from emb.training import checkpoint_file
from emb.training.run_config import TrainConfig

LEVELS = ("l1", "l2", "l3")


class RunError(ValueError):
    """A run whose checkpoint is missing or does not fit the data or the class table."""


@dataclass(frozen=True)
class TrainedRun:
    """A checkpoint's config and its weight sets, checked against the class table."""

    path: Path
    cfg: TrainConfig
    weights: dict[str, dict[str, torch.Tensor]]  # "raw" and, when saved, "ema"
    epoch: int | None
    trained_with: dict[str, str] = field(default_factory=dict)  # the checkpoint's provenance
    trained_tile: int | None = None  # the checkpoint's ``tile_size`` (None: written before it)

    @property
    def name(self) -> str:
        return self.path.parent.name

    @property
    def selected(self) -> str:
        """The weight set the best checkpoint was selected by (``ema.select_best_by``)."""
        chosen = self.cfg.ema.select_best_by
        return "ema" if chosen == "ema" and "ema" in self.weights else "raw"

    def model(self, weights: str, device: torch.device | None = None) -> nn.Module:
        """The model with weight set ``weights`` loaded, in eval mode, on ``device``."""
        model = build_model(self.cfg.model)
        try:
            model.load_state_dict(self.weights[weights])
        except RuntimeError as err:
            raise RunError(
                f"{self.path}: the {weights!r} weights do not fit the checkpoint's own model "
                f"config ({self.cfg.model}): {err}"
            ) from err
        return model.to(device or torch.device("cpu")).eval()

    @property
    def tile_size(self) -> int:
        """The side of the tiles the run was trained on (the windows of its maps), as its
        checkpoint records it; a checkpoint written before it did is refused naming the key."""
        if self.trained_tile is None:
            raise RunError(
                f"{self.path}: no 'tile_size' (the training tile side, recorded since issue 43); "
                "retrain the run, or give the window side: config predict.tile (--tile)"
            )
        return self.trained_tile

    def runtime(self, host: Host) -> Runtime:
        """The process's device, precision and memory format on ``host`` for this run,
        resolved by the rules training follows (:mod:`emb.models.runtime`); evaluation and
        prediction do not compile."""
        return Runtime.resolve(self.cfg.train, self.cfg.model.arch, host, training=False)

    @property
    def stats_dir(self) -> Path | None:
        """The channel statistics the run normalizes with, or None (no normalization)."""
        data = self.cfg.data
        return Path(data.stats_dir) if data.normalize and data.stats_dir else None

    def stats_digest(self) -> str:
        """The digest of those statistics as they are now (``unused`` without them)."""
        return digest_stats(self.stats_dir)

    def dequantize(self) -> Dequantize:
        """The run's own de-quantization (and TESSERA normalization), as in training."""
        return Dequantize.from_stats(self.cfg.data.source, self.stats_dir)

    def check_in_dim(self, in_dim: int, where: str) -> None:
        """The data's embedding dimension must be the one the model was trained on."""
        if self.cfg.model.in_dim != in_dim:
            raise RunError(
                f"{self.path}: model.in_dim is {self.cfg.model.in_dim}, "
                f"but {where} has in_dim {in_dim}"
            )


def find_checkpoint(run_dir: Path | str, name: str = "best.pt") -> Path:
    """``run_dir / name``, or a :class:`RunError` naming the run and what its folder holds."""
    run_dir = Path(run_dir)
    path = run_dir / name
    if path.is_file():
        return path
    if not run_dir.is_dir():
        found = f"{run_dir} does not exist"
    else:
        held = sorted(p.name for p in run_dir.glob("*.pt"))
        found = f"{run_dir} holds {', '.join(held) if held else 'no checkpoint'}"
    raise RunError(
        f"run {run_dir.name!r} has no checkpoint {path} ({found}); train it first, e.g. "
        f"snakemake results/runs/{run_dir.name}/train.json"
    )


def head_classes(state: dict[str, torch.Tensor]) -> dict[str, int]:
    """Classes per level, read from the heads' weights (``...heads.l3.weight``: (n, dim, 1, 1))."""
    out = {}
    for level in LEVELS:
        keys = [k for k in state if k.endswith(f"heads.{level}.weight")]
        if keys:
            out[level] = int(state[keys[0]].shape[0])
    return out


def load_run(path: Path, cmap: ClassMap, classes_path: Path | str) -> TrainedRun:
    """Read a checkpoint and check that its heads match the class table ``classes_path``."""
    state = checkpoint_file.load(path)
    if "config" not in state:
        raise RunError(f"{path}: checkpoint has no 'config' (not written by emb.training.train)")
    check_identity(state, Path(path))
    cfg = TrainConfig.from_dict(state["config"], f"{path}: config")
    weights = {"raw": state["model"]}
    if state.get("ema") is not None:
        weights["ema"] = checkpoint_file.strip_prefixes(state["ema"])
    expected = {"l1": len(cmap.l1_names), "l2": len(cmap.l2_names), "l3": len(cmap.l3_names)}
    configured = dict(zip(LEVELS, cfg.model.num_classes, strict=True))
    for name, state_dict in weights.items():
        found = {**configured, **head_classes(state_dict)}
        for level in LEVELS:
            if found[level] != expected[level]:
                raise RunError(
                    f"{path}: the {name} model's {level.upper()} head has {found[level]} "
                    f"classes, {classes_path} defines {expected[level]}"
                )
    epoch, tile = state.get("epoch"), state.get("tile_size")
    epoch = int(epoch) if epoch is not None else None
    return TrainedRun(Path(path), cfg, weights, epoch, dict(state.get("provenance", {})),
                      int(tile) if tile is not None else None)  # fmt: skip


# What makes a checkpoint another run's: its data and the shape of its model.
IDENTITY_KEYS = ("data.source", "model.arch", "model.in_dim", "model.num_classes")


def check_identity(state: dict, path: Path) -> None:
    """A checkpoint must be this run's: the run name it was trained under (when recorded) is
    its folder's, and its source, architecture, in_dim and classes are those of the run's
    ``config.yaml`` beside it. A checkpoint copied from another run is refused before any
    result of this run is rewritten."""
    trained_as = state.get("run")
    if trained_as is not None and trained_as != path.parent.name:
        raise RunError(
            f"{path}: run: expected {path.parent.name!r} (the folder it is in), found "
            f"{trained_as!r}: a checkpoint of another run"
        )
    config_path = path.parent / "config.yaml"
    if not config_path.is_file():
        return
    try:
        current = yaml.safe_load(config_path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise RunError(f"{config_path}: not readable YAML ({err})") from None
    if not isinstance(current, dict):
        return
    saved, now = (
        checkpoint_file.flatten_config(state["config"]),
        checkpoint_file.flatten_config(current),
    )
    for key in checkpoint_file.differing_keys(state["config"], current, IDENTITY_KEYS):
        if key in now:
            raise RunError(
                f"{path}: {key}: expected {now[key]!r} (the run's {config_path}), found "
                f"{saved.get(key)!r} in the checkpoint: a checkpoint of another run"
            )


def check_same_data(run: TrainedRun) -> None:
    """Evaluation must score the data the run was trained on: a manifest rebuilt since (other
    shards, other splits) could put training tiles into the test split; maps would come from
    a model the workflow is about to replace."""
    trained = run.trained_with.get("manifest_digest", UNKNOWN)
    manifest = Path(run.cfg.data.manifest)
    if trained == UNKNOWN or not manifest.is_file():
        return
    now = digest_file(manifest)
    if now != trained:
        raise RunError(
            f"{run.path}: trained on {manifest} with digest {trained[:12]}, which now has "
            f"digest {now[:12]}: the data changed since training; retrain the run "
            f"(snakemake --forcerun train) before evaluating or predicting with it"
        )
    check_same_stats(run)


def check_same_stats(run: TrainedRun) -> None:
    """The channel statistics a run normalizes with must be those it was trained with:
    changed statistics would shift every input without a word."""
    trained = run.trained_with.get("stats_digest", UNKNOWN)
    stats = run.stats_dir
    if trained == UNKNOWN or stats is None:
        return
    missing = [name for name in ("channel_mean.npy", "channel_std.npy")
               if not (stats / name).is_file()]  # fmt: skip
    if missing:
        raise RunError(f"{run.path}: trained with the channel statistics in {stats}, which "
                       f"no longer holds {', '.join(missing)}: rebuild them")  # fmt: skip
    now = run.stats_digest()
    if now != trained:
        raise RunError(
            f"{run.path}: trained with the channel statistics in {stats} with digest "
            f"{trained[:12]}, which now have digest {now[:12]}: the statistics changed since "
            "training; retrain the run (snakemake --forcerun train) before evaluating or "
            "predicting with it"
        )


def open_run(run_dir: Path | str, cmap: ClassMap, classes_path: Path | str,
             checkpoint_name: str = "best.pt") -> TrainedRun:  # fmt: skip
    """The run in ``run_dir`` from its checkpoint ``checkpoint_name``, trained on the data its
    config names as that data is now."""
    run = load_run(find_checkpoint(run_dir, checkpoint_name), cmap, classes_path)
    check_same_data(run)
    return run

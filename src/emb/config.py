"""Training configuration: plain data resolved once, saved next to the run's outputs.

Resolution order: ``config/train/defaults.yaml`` <- ``config/train/{run}.yaml`` <- overlays
(demo, cluster) <- ``key.path=value`` overrides. The merged dict is validated against
``workflow/schemas/train.schema.yaml`` (unknown keys rejected, defaults filled) by Snakemake's
own validator, then read into frozen dataclasses that reject unknown keys a second time.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from emb.io import atomic_path
from emb.models import ModelConfig


class ConfigError(ValueError):
    """A training configuration that cannot be used."""


OPTIONAL_SECTIONS = {"ema", "logging"}  # absent from checkpoints written before they existed


def deep_merge(base: dict, update: dict) -> dict:
    """``update`` over ``base``: dicts merge key by key, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_override(config: dict, override: str) -> dict:
    """``a.b.c=value`` (value parsed as YAML) applied to a copy of ``config``."""
    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected key.path=value")
    path, raw = override.split("=", 1)
    update: dict = {}
    node = update
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = yaml.safe_load(raw)
    return deep_merge(config, update)


def resolve(files: list[Path], overrides: list[str], schema: Path) -> dict:
    """Merge the YAML ``files`` in order, apply ``overrides``, validate and fill defaults."""
    from snakemake.utils import validate  # the workflow's validator, defaults included

    config: dict = {}
    for path in files:
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        config = deep_merge(config, loaded)
    for override in overrides:
        config = apply_override(config, override)
    validate(config, str(schema), set_default=True)
    TrainConfig.from_dict(config, " <- ".join(str(f) for f in files))  # cross-key rules
    return config


def _build(cls: type, data: dict[str, Any], where: str):
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(known)}")
    try:
        return cls(**data)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


@dataclass(frozen=True)
class LossConfig:
    weights: dict[str, float]
    label_smoothing: float = 0.05
    class_weights: str = "none"  # none | inverse | sqrt_inverse


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 3e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)


@dataclass(frozen=True)
class ScheduleConfig:
    warmup_steps: int = 500
    min_lr: float = 1e-6
    cooldown_steps: int = 0


@dataclass(frozen=True)
class EmaConfig:
    enabled: bool = True
    decay: float = 0.999
    select_best_by: str = "ema"  # ema | raw


@dataclass(frozen=True)
class LoggingConfig:
    log_every: int = 50
    wandb: bool = False
    wandb_mode: str = "offline"
    wandb_project: str = "emb"
    record_keys: bool = False  # keys/rank{r}.tsv: the sample keys of every micro-batch


@dataclass(frozen=True)
class LoopConfig:
    epochs: int = 100
    max_updates: int | None = None
    batch_size: int = 32
    accumulation: int = 1
    lr_scaling: str = "none"  # none | linear | sqrt
    reference_batch: int = 32
    grad_clip: float = 1.0
    precision: str = "bf16"  # bf16 | fp16 | fp32
    grad_scaler: bool | None = None  # None: only with fp16
    compile: bool = False
    compile_memory_budget: float | None = None
    channels_last: bool = False
    nonfinite_policy: str = "skip"  # skip | stop
    max_nonfinite_in_row: int = 5
    val_every_updates: int | None = None
    val_bn_batch_stats: bool = False
    val_min_batch: int = 1
    patience: int = 15
    save_every: int = 0
    checkpoint_every_updates: int = 0
    time_limit_s: float | None = None
    stop_margin_s: float = 120.0
    collective_timeout_s: float = 900.0  # a rank that waits longer on the others fails
    seed: int = 0
    num_workers: int = 4
    shuffle_buffer: int = 256
    restart: bool = True
    init_from: str | None = None

    def __post_init__(self) -> None:
        if self.grad_scaler and self.precision == "bf16":
            raise ConfigError(
                "train.grad_scaler: true is refused with train.precision: bf16 (bf16 has fp32's "
                "range; a GradScaler skipped 75-87% of optimizer steps in the seeds' runs). "
                "Use precision: fp16 for a GradScaler, or leave grad_scaler unset"
            )

    @property
    def uses_grad_scaler(self) -> bool:
        return self.precision == "fp16" if self.grad_scaler is None else self.grad_scaler


@dataclass(frozen=True)
class DataConfig:
    source: str
    manifest: str = ""  # set by the workflow's train_config rule
    stats_dir: str | None = None
    normalize: bool = False
    classes: str = "config/classes.csv"


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig
    loss: LossConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    train: LoopConfig
    data: DataConfig
    ema: EmaConfig = EmaConfig()
    logging: LoggingConfig = LoggingConfig()

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> TrainConfig:
        parts = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(data) - set(parts))
        if unknown:
            raise ConfigError(f"{where}: unknown section(s) {unknown}; allowed: {sorted(parts)}")
        missing = sorted(set(parts) - set(data) - OPTIONAL_SECTIONS)
        if missing:
            raise ConfigError(f"{where}: missing section(s) {missing}")
        classes = {
            "model": ModelConfig,
            "loss": LossConfig,
            "optimizer": OptimizerConfig,
            "schedule": ScheduleConfig,
            "train": LoopConfig,
            "data": DataConfig,
            "ema": EmaConfig,
            "logging": LoggingConfig,
        }
        built = {k: _build(classes[k], dict(data[k]), f"{where}: {k}") for k in parts if k in data}
        return cls(**built)


def load(path: Path) -> tuple[TrainConfig, dict]:
    """A resolved config file -> (dataclasses, the plain dict saved in checkpoints)."""
    data = yaml.safe_load(Path(path).read_text())
    return TrainConfig.from_dict(data, str(path)), data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Resolve a run's training configuration.")
    parser.add_argument("files", type=Path, nargs="+", help="YAML files, later ones win")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE"
    )
    parser.add_argument("--schema", type=Path, default=Path("workflow/schemas/train.schema.yaml"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        config = resolve(args.files, args.overrides, args.schema)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    with atomic_path(args.out) as tmp:
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

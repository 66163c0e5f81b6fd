"""A run's training configuration as frozen dataclasses, read from its resolved ``config.yaml``.

The schema (``workflow/schemas/train.schema.yaml``) holds every default; the dataclasses state
none and take the schema's (:func:`emb.models.train_defaults.schema_defaults`), so pure code
and tests can build a config without the workflow and get what a run gets
(``tests/training/test_defaults_once.py`` fails on a default stated a second time). They
reject unknown keys a second time.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from emb.io import read_yaml
from emb.models.model_config import ModelConfig
from emb.models.train_defaults import schema_defaults


class ConfigError(ValueError):
    """A training configuration that cannot be used."""


# The global batch at which the seeds tuned each architecture's optimizer.lr (SegFormer 3e-4
# at batch 32, DeepLab 1e-4 at batch 64); train.reference_batch: null takes it.
REFERENCE_BATCH = {"segformer": 32, "deeplab": 64}
OPTIONAL_SECTIONS = {"ema", "logging"}  # absent from checkpoints written before they existed


def check_grad_scaler(precision: str, grad_scaler: bool | None) -> None:
    """Refuse a GradScaler with bf16, where the config enters (before any job): the one place
    this refusal lives; whether a scaler runs is the runtime's rule
    (:meth:`emb.models.runtime.Runtime.grad_scaler`)."""
    if grad_scaler and precision == "bf16":
        raise ConfigError(
            "train.grad_scaler: true is refused with train.precision: bf16 (bf16 has fp32's "
            "range; a GradScaler skipped 75-87% of optimizer steps in the seeds' runs). "
            "Use precision: fp16 for a GradScaler, or leave grad_scaler unset"
        )


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
@schema_defaults("loss")
class LossConfig:
    weights: dict[str, float]
    label_smoothing: float
    class_weights: str  # none | inverse | sqrt_inverse


@dataclass(frozen=True)
@schema_defaults("optimizer", tuples=("betas",))
class OptimizerConfig:
    lr: float
    weight_decay: float
    betas: tuple[float, float]


@dataclass(frozen=True)
@schema_defaults("schedule")
class ScheduleConfig:
    warmup_steps: int
    min_lr: float
    cooldown_steps: int


@dataclass(frozen=True)
@schema_defaults("ema")
class EmaConfig:
    enabled: bool
    decay: float
    warmup: bool  # decay min(decay, (1 + n) / (10 + n)) at update n; false: fixed decay
    select_best_by: str  # ema | raw


@dataclass(frozen=True)
@schema_defaults("logging")
class LoggingConfig:
    log_every: int  # a brief line (epoch, step, loss, lr)
    detail_every: int  # a detailed line (heads, grad norm, samples/s, data wait, memory)
    wandb: bool
    wandb_mode: str
    wandb_project: str
    record_keys: bool  # keys/rank{r}.tsv: the sample keys of every micro-batch


@dataclass(frozen=True)
@schema_defaults("train")
class LoopConfig:
    epochs: int
    max_updates: int | None
    batch_size: int
    accumulation: int
    lr_scaling: str  # none | linear | sqrt
    reference_batch: int | None  # None: the architecture's (REFERENCE_BATCH)
    grad_clip: float
    precision: str  # bf16 | fp16 | fp32 (a CPU: fp32; emb.models.runtime)
    grad_scaler: bool | None  # None: only with fp16 (emb.models.runtime)
    compile: bool
    compile_memory_budget: float | None
    channels_last: bool | str  # auto | true | false (emb.models.runtime)
    nonfinite_policy: str  # skip | stop
    max_nonfinite_in_row: int
    val_every_updates: int | None
    val_bn_batch_stats: bool
    val_min_batch: int
    patience: int
    save_every: int
    checkpoint_every_updates: int
    time_limit_s: float | None
    stop_margin_s: float
    collective_timeout_s: float  # a rank that waits longer on the others fails
    seed: int
    num_workers: int
    shuffle_buffer: int
    restart: bool
    resume_from: str  # last | best | epoch_N | a checkpoint path
    init_from: str | None

    def __post_init__(self) -> None:
        check_grad_scaler(self.precision, self.grad_scaler)
        if self.val_min_batch > self.batch_size:  # known before any job: refused at parse time
            raise ConfigError(
                f"train.val_min_batch: {self.val_min_batch} is larger than train.batch_size "
                f"{self.batch_size}; a validation batch holds at most batch_size samples, so "
                "every one would be skipped and the run would never validate (no best.pt); "
                f"expected val_min_batch <= {self.batch_size}"
            )
        if self.resume_from.startswith("epoch_") and not self.resume_from[6:].isdigit():
            raise ConfigError(
                f"train.resume_from: expected last, best, epoch_N (N an epoch number) or a "
                f"checkpoint path, found {self.resume_from!r}"
            )
        if not self.restart and self.resume_from != "last":
            raise ConfigError(
                f"train.resume_from: {self.resume_from!r} resumes, but train.restart is false "
                "(start over); expected resume_from: last with restart: false"
            )


@dataclass(frozen=True)
@schema_defaults("data")
class DataConfig:
    source: str
    manifest: str  # set by the workflow's train_config rule
    stats_dir: str | None
    normalize: bool
    classes: str


@dataclass(frozen=True)
class TrainConfig:
    """A run's configuration; ``resolved`` is the plain dict it was read from (saved in
    checkpoints and compared on resume)."""

    model: ModelConfig
    loss: LossConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    train: LoopConfig
    data: DataConfig
    ema: EmaConfig = EmaConfig()
    logging: LoggingConfig = LoggingConfig()
    resolved: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> TrainConfig:
        unknown = sorted(set(data) - set(SECTIONS))
        if unknown:
            raise ConfigError(f"{where}: unknown section(s) {unknown}; allowed: {sorted(SECTIONS)}")
        missing = sorted(set(SECTIONS) - set(data) - OPTIONAL_SECTIONS)
        if missing:
            raise ConfigError(f"{where}: missing section(s) {missing}")
        built = {k: _build(SECTIONS[k], dict(data[k]), f"{where}: {k}") for k in data}
        return cls(**built, resolved=copy.deepcopy(data))

    def with_value(self, section: str, key: str, value: Any) -> TrainConfig:
        """A copy with ``section.key`` set (e.g. DeepLab's rates fixed for the run's tiles)."""
        data = copy.deepcopy(self.resolved)
        data[section][key] = value
        return TrainConfig.from_dict(data)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "loss": LossConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "train": LoopConfig,
    "data": DataConfig,
    "ema": EmaConfig,
    "logging": LoggingConfig,
}


def load(path: Path) -> TrainConfig:
    """A resolved config file as dataclasses (``.resolved`` keeps the plain dict)."""
    data = read_yaml(path, ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections")
    return TrainConfig.from_dict(data, str(path))

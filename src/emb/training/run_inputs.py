"""What a run reads before it builds anything: its shard manifest (checked against the model,
every shard present) and the folder of the channel statistics it normalizes with."""

from __future__ import annotations

from pathlib import Path

from emb.prep.manifest import read_manifest
from emb.training.config import ConfigError, TrainConfig


def read_checked_manifest(cfg: TrainConfig) -> dict:
    """The run's manifest, checked against the model and with every shard present (before a
    start can set an earlier run aside)."""
    manifest = read_manifest(Path(cfg.data.manifest))
    if manifest["in_dim"] != cfg.model.in_dim:
        raise ConfigError(
            f"{cfg.data.manifest}: in_dim is {manifest['in_dim']}, "
            f"but model.in_dim is {cfg.model.in_dim}"
        )
    for split in ("train", "val"):
        missing = [s for s in manifest["splits"][split]["shards"] if not Path(s).is_file()]
        if missing:
            raise ValueError(
                f"{cfg.data.manifest}: the {split} split lists {len(missing)} shard(s) that do "
                f"not exist, e.g. {missing[0]}; rebuild the shards (snakemake --forcerun shards)"
            )
    return manifest


def stats_dir(cfg: TrainConfig) -> Path | None:
    """The channel statistics the run normalizes with, or None (no normalization)."""
    return Path(cfg.data.stats_dir) if cfg.data.normalize and cfg.data.stats_dir else None

"""What a run reads before it builds anything: its shard manifest (checked against the model,
every shard present, a validation split that can be scored) and the folder of the channel
statistics it normalizes with."""

from __future__ import annotations

from pathlib import Path

from emb.loading.batches import shard_sample_counts, shards_for_rank
from emb.prep.manifest import read_manifest
from emb.training.config import ConfigError, TrainConfig


class ValidationTooSmall(ValueError):
    """The validation split cannot fill one scored batch on any rank: the run would never
    validate (no best.pt, nothing for evaluate), yet look finished."""


def read_checked_manifest(cfg: TrainConfig, world: int | None = None) -> dict:
    """The run's manifest, checked against the model and with every shard present (before a
    start can set an earlier run aside); with ``world`` (the ranks), also checked to give a
    validation that scores something (:func:`check_validation_scored`)."""
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
    if world is not None:
        check_validation_scored(
            manifest["splits"]["val"], cfg.data.manifest, cfg.train.batch_size,
            cfg.train.val_min_batch, world,
        )  # fmt: skip
    return manifest


def validation_shares(val: dict, world: int) -> list[int]:
    """Validation samples each rank reads: its shards of the split, shared out round-robin
    as :func:`emb.loading.batches.eval_batches` shares them."""
    counts = shard_sample_counts(val)
    return [sum(counts[s] for s in shards_for_rank(val["shards"], r, world)) for r in range(world)]


def check_validation_scored(
    val: dict, manifest: str, batch: int, min_batch: int, world: int
) -> None:
    """Refuse a validation split that no rank can score: a rank's first batch holds
    min(``batch``, its samples), and a batch smaller than ``min_batch`` is skipped
    (``train.val_min_batch``). A rank without a scored batch is fine while another scores:
    the ranks sum their counts. Raises :class:`ValidationTooSmall` naming the split, its
    samples, the batch and the ranks."""
    shares = validation_shares(val, world)
    busiest = max(shares, default=0)
    if min(batch, busiest) >= min_batch:
        return
    idle = sum(1 for n in shares if n == 0)
    spread = f"the busiest of {world} rank(s) reads {busiest}" + (
        f", {idle} read none" if idle else ""
    )
    raise ValidationTooSmall(
        f"{manifest}: split 'val' holds {val['samples']} sample(s) in {len(val['shards'])} "
        f"shard(s); {spread}; a validation batch holds at most train.batch_size {batch} and "
        f"one smaller than train.val_min_batch {min_batch} is skipped: no validation would "
        f"score a sample, so the run would never validate (no best.pt for evaluate); expected "
        f"at least {min_batch} validation samples on one rank: lower train.val_min_batch, use "
        "fewer ranks (launch.nproc_per_node, the profile's tasks_per_node), or give the val "
        "split more samples (its regions, splits.fractions, shards.max_samples)"
    )


def stats_dir(cfg: TrainConfig) -> Path | None:
    """The channel statistics the run normalizes with, or None (no normalization)."""
    return Path(cfg.data.stats_dir) if cfg.data.normalize and cfg.data.stats_dir else None

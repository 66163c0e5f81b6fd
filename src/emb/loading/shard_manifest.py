"""The shard manifest (``results/shards/{source}/manifest.json``, written by the manifest stage)
as every stage that consumes it reads it: checked once, refused naming the file; and whether
its validation split can score a batch on the ranks that train on it (asked by the manifest
stage before any training job is queued, and by training when it starts)."""

from __future__ import annotations

from pathlib import Path

from emb.io import read_json


def shards_for_rank(shards: list[str], rank: int, world: int) -> list[str]:
    """Round-robin: the ranks' disjoint subsets of a split's ``shards`` that together cover it."""
    return shards[rank::world]


def shard_sample_counts(split: dict) -> dict[str, int]:
    """{shard path: sample count} of one manifest split."""
    return dict(zip(split["shards"], split["shard_samples"], strict=True))


class ManifestError(ValueError):
    """Region indexes that cannot form one manifest, or a file that is not a manifest."""


def read_manifest(
    path: Path, splits: tuple[str, ...] = ("train", "val"), keys: tuple[str, ...] = ("in_dim",)
) -> dict:
    """The shard manifest at ``path``, refused naming the file when it is not one (every stage
    that consumes a manifest reads it here)."""
    manifest = read_json(path, "JSON shard manifest", "rebuild it (snakemake --forcerun manifest)")
    found = manifest.get("splits") if isinstance(manifest, dict) else None
    missing = [k for k in splits if not isinstance(found, dict) or k not in found]
    if not isinstance(manifest, dict) or not set(keys) <= set(manifest) or missing:
        raise ManifestError(
            f"{path}: expected a shard manifest with {' and '.join(keys)} and splits "
            f"{' and '.join(splits)}, "
            f"found keys {sorted(manifest) if isinstance(manifest, dict) else type(manifest)}"
        )
    return manifest


class ValidationTooSmall(ValueError):
    """The validation split cannot fill one scored batch on any rank: the run would never
    validate (no best.pt, nothing for evaluate), yet look finished."""


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

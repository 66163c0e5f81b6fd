"""Stage: merge the per-region shard indexes of one source into ``manifest.json``.

The manifest is what the loader, the statistics and the trainer read: per split the shard
list, sample count, labelled pixels and the L3 class histogram; for the source its ``in_dim``,
tile size and dtype.
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from pathlib import Path

import numpy as np

from emb import stage_runner
from emb.io import write_json
from emb.loading.shard_manifest import ManifestError, check_validation_scored
from emb.prep.region_index import read_index
from emb.prep.spatial_split import SPLITS

log = logging.getLogger(__name__)


def merge_indexes(indexes: list[dict], paths: list[Path]) -> dict:
    """One manifest from region indexes of the same source (checked to agree)."""
    first = indexes[0]
    for key in ("source", "in_dim", "tile_size", "dtype"):
        for idx, path in zip(indexes, paths, strict=True):
            if idx[key] != first[key]:
                raise ManifestError(f"{path}: {key} is {idx[key]!r}, {paths[0]} has {first[key]!r}")
    manifest = {key: first[key] for key in ("source", "in_dim", "tile_size", "dtype")}
    manifest["regions"] = [idx["region"] for idx in indexes]
    # the products' own version/year tags per region, where their files carry them
    manifest["product_tags"] = {
        idx["region"]: idx["product_tags"] for idx in indexes if idx.get("product_tags")
    }
    dropped: dict[str, Counter[str]] = {}
    for idx in indexes:
        for split, reasons in idx["dropped"].items():
            dropped.setdefault(split, Counter()).update(reasons)
    manifest["dropped_unassigned"] = dict(dropped.get("unassigned", {}))
    manifest["label_coverage"] = {
        idx["region"]: idx["label_coverage"] for idx in indexes if "label_coverage" in idx
    }
    manifest["splits"] = {}
    for split in SPLITS:
        parts = [idx["splits"][split] for idx in indexes]
        shards = [s for p in parts for s in p["shards"]]
        n = sum(p["samples"] for p in parts)
        manifest["splits"][split] = {
            "tiles": n,
            "dropped": dict(dropped.get(split, {})),
            "shards": [s["path"] for s in shards],
            "shard_samples": [s["samples"] for s in shards],
            "shard_keys": [s.get("keys", []) for s in shards],
            "samples": n,
            "labelled_pixels": sum(p["labelled_pixels"] for p in parts),
            "class_hist": np.sum([p["class_hist"] for p in parts], axis=0).tolist(),
            "bytes_per_sample": sum(s["bytes"] for s in shards) / n if n else 0,
        }
    return manifest


def check_shard_count(manifest: dict, ranks: int, workers: int, path: Path | str) -> None:
    """Refuse a train split with fewer shards than training ranks: every rank must read shards
    of its own, and the training job would fail on it only after its queue wait for a node.
    This rule runs where Snakemake runs, before any GPU job."""
    part = manifest["splits"]["train"]
    if len(part["shards"]) < ranks:
        raise ManifestError(
            f"{path}: {manifest['source']} split 'train' has {len(part['shards'])} shards, "
            f"expected at least {ranks} (one per training rank; {ranks} ranks x "
            f"{max(workers, 1)} reader threads = {ranks * max(workers, 1)} readers would use "
            "one shard each): lower shards.max_samples or train on fewer ranks"
        )


def shard_count_warnings(manifest: dict, ranks: int, workers: int) -> list[str]:
    """Splits with fewer shards than ranks x workers: some reader would idle or repeat."""
    readers = ranks * max(workers, 1)
    return [
        f"{manifest['source']} split {split!r} has {len(part['shards'])} shards for {ranks} "
        f"ranks x {max(workers, 1)} workers = {readers} readers; lower shards.max_samples"
        for split, part in manifest["splits"].items()
        if len(part["shards"]) < readers
    ]


def validation_option(text: str) -> tuple[str, int, int]:
    """An argparse type: ``RUN:BATCH:MIN_BATCH`` (the rule's, from each run's config)."""
    try:
        name, batch, min_batch = text.rsplit(":", 2)
        return name, int(batch), int(min_batch)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected RUN:BATCH:MIN_BATCH (e.g. aef_segformer:32:2), found {text!r}"
        ) from None


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("indexes", type=Path, nargs="+", help="region index JSON files")
    parser.add_argument("--out", type=Path, required=True)
    # no config settings: the rule passes the training job's shape (profile, run configs);
    # by hand the defaults are one reader, the check's weakest form
    parser.add_argument("--ranks", type=int, default=1, help="training processes (all nodes)")
    parser.add_argument("--workers", type=int, default=0, help="loader workers per process")
    parser.add_argument("--validation", type=validation_option, action="append", default=None,
                        metavar="RUN:BATCH:MIN_BATCH", help="a run's train.batch_size and "
                        "train.val_min_batch: its val split must score a batch on --ranks "
                        "ranks (once per run of the source)")  # fmt: skip
    args = parser.parse_args(argv)
    manifest = merge_indexes([read_index(p) for p in args.indexes], args.indexes)
    for split in ("train", "val", "test"):
        if manifest["splits"][split]["samples"] == 0:
            raise ManifestError(
                f"split {split!r} of {manifest['source']} has no tiles "
                f"(dropped: {manifest['splits'][split]['dropped']}, straddling splits: "
                f"{manifest['dropped_unassigned']}); lower tiles.min_valid or change the split"
            )
    check_shard_count(manifest, args.ranks, args.workers, args.out)
    for run, batch, min_batch in args.validation or []:
        where = f"{args.out} (run {run!r}, {args.ranks} rank(s))"
        check_validation_scored(manifest["splits"]["val"], where, batch, min_batch, args.ranks)
    manifest["warnings"] = shard_count_warnings(manifest, args.ranks, args.workers)
    for warning in manifest["warnings"]:
        log.warning("%s", warning)
    write_json(args.out, manifest)
    log.info("%s: samples %s", args.out, {s: v["samples"] for s, v in manifest["splits"].items()})


if __name__ == "__main__":
    main()

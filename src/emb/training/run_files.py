"""A run's files as the workflow names them while it parses: the train schema, the files its
config is merged from (``emb.training.train_config`` resolves them) and what rule train reads.

Paths are relative to the working directory, the project: a job input holding the checkout's
absolute path would rerun every job after it once the project is copied or moved.
"""

from __future__ import annotations

import os
from pathlib import Path

from emb.training.train_config import run_config_files

DEMO_OVERLAY = "config/train/demo.yaml"  # the demo's small model and epochs, for demo data


def schema_path(basedir: Path) -> str:
    """The train schema of the workflow in ``basedir`` (the Snakefile's folder), relative to
    the working directory when it lies inside, else absolute."""
    schema = Path(basedir) / "workflow/schemas/train.schema.yaml"
    relative = os.path.relpath(schema)
    return str(schema if relative.startswith("..") else relative)


def shared_overlays(train_overlays: list[str], cluster_overlay: object) -> list[str]:
    """The overlays every run gets, in order: the config's ``train_overlays``, then the
    profile's cluster overlay (rule train_config's ``train_overlay`` resource; None: unset)."""
    return [*train_overlays, *([str(cluster_overlay)] if cluster_overlay else [])]


def config_files(run: str, demo: bool, overlays: list[str]) -> list[str]:
    """The files of ``run``'s config, merged in this order, each once: defaults, the run's
    own file, the demo overlay for demo data (``demo``: every training region of the run's
    source is a demo raster), then ``overlays`` (:func:`shared_overlays`)."""
    return run_config_files(run, [*([DEMO_OVERLAY] if demo else []), *overlays])


def train_inputs(run: str, source: str) -> dict[str, str]:
    """What rule train reads for ``run`` of ``source``: its resolved config, and its source's
    shard manifest and channel statistics."""
    return {
        "config": f"results/runs/{run}/config.yaml",
        "manifest": f"results/shards/{source}/manifest.json",
        "stats": f"results/stats/{source}/stats.json",
    }

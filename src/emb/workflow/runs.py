"""A run as the workflow sees it while it parses: the train schema, the files its config is
merged from, that config resolved as its train_config job will resolve it (by
:func:`emb.training.train_config.resolve`, checked before any job), and what rule train reads.

Paths are relative to the working directory, the project: a job input holding the checkout's
absolute path would rerun every job after it once the project is copied or moved.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from emb.training.run_config import ConfigError, TrainConfig
from emb.training.schedule import lr_warnings
from emb.training.train_config import resolve

DEFAULTS = "config/train/defaults.yaml"


def run_file(run: str) -> str:
    """The run's own file (config/train/{run}.yaml): what makes it the run it is."""
    return f"config/train/{run}.yaml"


def _resolved(run: str, files: list[str], schema: Path) -> dict:
    """``resolve`` with every failure as one ConfigError naming the run."""
    from snakemake.exceptions import WorkflowError  # what Snakemake's validator raises

    try:
        return resolve([Path(f) for f in files], [], schema)
    except (ConfigError, OSError, WorkflowError) as err:
        raise ConfigError(f"train config of run {run!r}: {err}") from None


def run_source(run: str, schema: Path) -> str:
    """The run's ``data.source``, from defaults and its own file only (what decides whether
    the demo overlay applies)."""
    return _resolved(run, [DEFAULTS, run_file(run)], schema)["data"]["source"]


def run_config_files(run: str, overlays: list[str]) -> list[str]:
    """defaults <- the run's file <- ``overlays`` (the demo overlay for demo data, the config's
    train_overlays, the profile's cluster overlay), each file merged once."""
    # a file listed twice (the demo overlay in train_overlays too) is merged once
    return list(dict.fromkeys([DEFAULTS, run_file(run), *overlays]))


def resolve_run(run: str, files: list[str], schema: Path, source: str) -> dict:
    """The run's config as its train_config job will resolve it, checked before any job: every
    file against the schema, and an overlay may not change the run's ``source``."""
    config = _resolved(run, files, schema)
    if config["data"]["source"] != source:
        raise ConfigError(
            f"train config of run {run!r}: data.source: expected the run file's {source!r} "
            f"({run_file(run)}), found {config['data']['source']!r} after the overlays "
            f"{files[2:]}"
        )
    return config


def loader_workers(configs: Iterable[dict], source: str) -> int:
    """The most reader threads per rank any run of ``source`` asks for (cluster overlay
    included): what the manifest's shard-count check needs shards for; 0 without a run."""
    workers = [c["train"]["num_workers"] for c in configs if c["data"]["source"] == source]
    return max(workers, default=0)


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


def lr_warning_lines(run_config: dict, world: int) -> list[str]:
    """The warnings of a resolved run config whose lr_scaling at ``world`` ranks takes
    optimizer.lr to where the seeds saw its architecture diverge."""
    return lr_warnings(TrainConfig.from_dict(run_config), world)

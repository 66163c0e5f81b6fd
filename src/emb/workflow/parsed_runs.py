"""A run as the workflow sees it while it parses: the train schema, the files its config is
merged from, that config resolved as its train_config job will resolve it (by
:func:`emb.training.train_config.resolve`, checked before any job), and what rule train reads.

Paths are relative to the working directory, the project: a job input holding the checkout's
absolute path would rerun every job after it once the project is copied or moved.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from contextlib import suppress
from pathlib import Path

from emb.evaluation.predict_spec import (
    PredictSettingsError,
    PredictSpec,
    check_window_side,
    model_downsampling,
)
from emb.io import read_yaml
from emb.prep.data_settings import tiling_in_force
from emb.rasters import SOURCES
from emb.training.lr_scaling import lr_warnings
from emb.training.run_config import ConfigError, TrainConfig
from emb.training.train_config import deep_merge, resolve
from emb.workflow.region_table import RegionTable, check_tilings

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
    the demo overlay applies). Read from the two files where they name a source: the run's
    whole config is resolved and checked against the schema right after (:func:`resolve_run`,
    which refuses an overlay that changes the source); resolving these two as well was half
    of the parse's eight resolutions (0.1-0.3 s each on a loaded 2-core machine). Resolved,
    its error naming the run, where they name none (a missing or broken file, a source the
    schema refuses)."""
    with suppress(ConfigError, OSError):
        files = [read_yaml(path, ConfigError) for path in (DEFAULTS, run_file(run))]
        if all(isinstance(f, dict) or f is None for f in files):
            data = deep_merge(files[0] or {}, files[1] or {}).get("data")
            if isinstance(data, dict) and data.get("source") in SOURCES:
                return data["source"]
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


PREDICT_KEYS = {"overlap": "config predict.overlap", "block": "config predict.block",
                "batch_size": "config predict.batch_size"}  # fmt: skip


def check_run_windows(
    run: str, run_config: Mapping, tile: int, tile_key: str, predict: Mapping
) -> None:
    """Refuse, before any job, a run whose model cannot map its tiles or predict's windows:
    the training tile (``tile``, the config's ``tile_key``: ``tiles.size`` or the demo
    overlay's) and predict's window side must be multiples of the model's total downsampling,
    and ``predict``'s overlap must leave a stride of a pixel or more. Raises
    :class:`emb.evaluation.predict_spec.PredictSettingsError` naming the key and a value that
    works (found before only when the predict job started, after a whole training)."""
    model = run_config["model"]
    stages = len(model["widths"])
    multiple = model_downsampling(model["arch"], stages)
    whose = f"run {run!r} ({model['arch']}, {stages} stages): "
    spec = PredictSpec(
        predict.get("tile") or tile, predict["overlap"], predict["block"], predict["batch_size"]
    )
    names = {**PREDICT_KEYS, "tile": "config predict.tile" if predict.get("tile") else
             f"config {tile_key}"}  # fmt: skip
    try:
        check_window_side(tile, multiple, f"config {tile_key}")
        spec.check(multiple, names)
    except PredictSettingsError as err:
        raise PredictSettingsError(whose + str(err)) from None


def check_windows(
    config: Mapping, table: RegionTable, run_sources: Mapping[str, str], parsed_runs: Mapping
) -> None:
    """Every run's tiles and predict's windows (:func:`check_run_windows`), each run with its
    source's tile size as its shards jobs get it (the demo overlay's for demo data), and the
    tiling of each source trained on (:func:`emb.workflow.region_table.check_tilings`)."""
    check_tilings(config, table, run_sources.values())
    for run, source in run_sources.items():
        tiling = tiling_in_force(config, table.is_demo_data(source))
        tile, key = int(tiling.tiles["size"]), tiling.keys["tiles.size"]
        check_run_windows(run, parsed_runs[run], tile, key, config["predict"])

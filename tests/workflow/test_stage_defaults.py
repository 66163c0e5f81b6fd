"""Every default stated once (issue 43): a stage's command line and the tiling dataclasses take
a setting's default from workflow/schemas/config.schema.yaml, or have none. Before, the shards
stage defaulted to 64 px tiles in 1280 m blocks against the config's 256 px in 5120 m, and
``SplitSpec()`` with ``TileSpec(256)`` dropped every tile as straddling."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest
import yaml

import emb
from emb import config_schema
from emb.config_schema import SchemaError, config_default
from emb.prep.spatial_split import SPLITS, SplitSpec
from emb.prep.tiles import TileSpec

SRC = Path(emb.__file__).resolve().parent  # the package under test (a copy's, if first)
SCHEMA = SRC.parents[1] / "workflow" / "schemas" / "config.schema.yaml"
STAGE_PACKAGES = ("prep", "report", "areas", "estimation")  # the data, report and area rules
KEY = re.compile(r"\bconfig ([a-z_]+(?:\.[a-z_]+)*)")  # how an option's help names its setting
# options with a default that is no setting of the config, and why
NOT_SETTINGS = {
    ("emb.prep.align_labels", "block"): "rows read at a time: memory, not a result",
    ("emb.prep.manifest", "ranks"): "one rank: the training job's shape, set by the profile",
    ("emb.prep.manifest", "workers"): "no loader threads: the run's train.num_workers",
    ("emb.estimation.area_estimates", "threads"): "a reader thread or none: the rule's threads, "
    "not a result (the counts are the same)",
    ("emb.estimation.sample_design", "threads"): "a reader thread or none: the rule's threads, "
    "not a result (the points are the same)",
}


def schema_default(key: str):
    """The schema's default, read here apart from the code under test."""
    node = yaml.safe_load(SCHEMA.read_text())
    for part in key.split("."):
        node = node["properties"][part]
    return node["default"]


class Parsed(BaseException):
    """Carries a stage's parser out of its ``main`` (a BaseException: the stage wrapper lets
    it through)."""


def stage_parser(module: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    def parse_args(self, *args, **kwargs):
        raise Parsed(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
        with pytest.raises(Parsed) as parsed:
            importlib.import_module(module).main([])
    return parsed.value.args[0]


def stage_modules() -> list[str]:
    return sorted(
        f"emb.{package}.{path.stem}"
        for package in STAGE_PACKAGES
        for path in (SRC / package).glob("*.py")
        if "@stage_runner.stage" in path.read_text()
    )


def parsed_default(action: argparse.Action, value):
    """``value`` as the option holds it once parsed (argparse parses a text default; a section
    passed whole is JSON text, e.g. the area settings)."""
    if isinstance(value, str) and action.type is not None:
        return action.type(value)
    if isinstance(value, str) and "as JSON" in (action.help or ""):
        return json.loads(value)
    return value


def test_the_stages_are_found() -> None:
    found = stage_modules()
    assert {"emb.prep.shards", "emb.prep.channel_stats", "emb.areas.fetch"} <= set(found)
    assert len(found) >= 10, found


@pytest.mark.parametrize("module", stage_modules())
def test_no_stage_option_states_a_default_of_its_own(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An option that is a config setting has the schema's default or none; any other option
    with a default is a listed non-setting."""
    for action in stage_parser(module, monkeypatch)._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        key = KEY.search(action.help or "")
        where = f"{module} {action.option_strings[0] if action.option_strings else action.dest}"
        if key:
            expected = schema_default(key[1])  # KeyError: a key the schema lacks
            if action.required or action.default is None:
                continue
            found = parsed_default(action, action.default)
            assert found == parsed_default(action, expected), (
                f"{where}: default {found!r}, the schema's {key[1]} is {expected!r}"
            )
        elif action.default not in (None, "", False):
            assert (module, action.dest) in NOT_SETTINGS, (
                f"{where}: default {action.default!r} is no config setting: make it required, "
                f"or take the schema's with config_option"
            )


def test_the_shards_stage_needs_the_tilings_scale(monkeypatch, capsys) -> None:
    """Tile size and block size decide together whether any tile fits a block: never a
    default, in either order of their demo and full-size values."""
    from emb.prep import shards

    with pytest.raises(SystemExit) as exited:
        shards.main(["--source=aef", "--region=r", "--emb=e.tif", "--labels=l.tif",
                     "--index=i.json"])  # fmt: skip
    assert exited.value.code == 2
    assert "required: --tile-size, --block-m" in capsys.readouterr().err
    parser = stage_parser("emb.prep.shards", monkeypatch)
    args = parser.parse_args(["--source=aef", "--region=r", "--emb=e.tif", "--labels=l.tif",
                              "--index=i.json", "--tile-size=32", "--block-m=320"])  # fmt: skip
    assert args.stride is None  # the tile size, as TileSpec takes None
    # the schema's defaults parsed as the rule's values are: 0 -> 0.0 for a float option
    assert isinstance(args.buffer_m, float) and isinstance(args.min_valid, float)
    assert (args.buffer_m, args.max_samples) == (schema_default("splits.buffer_m"),
                                                 schema_default("shards.max_samples"))  # fmt: skip


def test_the_tiling_dataclasses_state_their_scale_and_default_the_rest_to_the_schema() -> None:
    with pytest.raises(TypeError, match="size"):
        TileSpec()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="block_m"):
        SplitSpec()  # type: ignore[call-arg]
    tile = TileSpec(schema_default("tiles.size"))
    split = SplitSpec(schema_default("splits.block_m"))
    assert tile.stride == tile.size and tile.min_valid == schema_default("tiles.min_valid")
    assert split.fractions == dict(zip(SPLITS, schema_default("splits.fractions"), strict=True))
    assert (split.seed, split.buffer_m) == (schema_default("splits.seed"),
                                           schema_default("splits.buffer_m"))  # fmt: skip
    assert isinstance(split.buffer_m, float) and isinstance(tile.min_valid, float)
    assert tile.size * 10 <= split.block_m  # the config's tiles fit its blocks (10 m pixels)


def test_a_key_the_schema_lacks_or_a_missing_schema_is_one_clear_error(tmp_path: Path) -> None:
    assert config_default("stats.n_tiles") == schema_default("stats.n_tiles")
    assert config_schema.SCHEMA == SCHEMA
    with pytest.raises(SchemaError, match=r"expected a setting 'tiles.sise', found no 'sise'"):
        config_default("tiles.sise")
    with pytest.raises(SchemaError, match=r"expected a default for 'runs', found none"):
        config_default("runs")
    missing = tmp_path / "config.schema.yaml"
    with pytest.raises(SchemaError, match=re.escape(str(missing))):
        config_default("tiles.size", missing)


@pytest.mark.parametrize("null_source", ["aef", "tessera", "cdl"])
def test_a_collection_left_null_passes_validation_and_stays_unused(null_source: str) -> None:
    """The schema says a null source is not used; Snakemake's validator sets the defaults of an
    object's properties before it checks the type, so a default inside a nullable source would
    crash it on null (``'NoneType' object has no attribute 'setdefault'``)."""
    from snakemake.utils import validate

    config = yaml.safe_load((SCHEMA.parents[2] / "config/config.yaml").read_text())
    given = {"aef": {"folder": "a", "index": "a.parquet"}, "tessera": {"folder": "t"},
             "cdl": {"path": "c/{year}"}}  # fmt: skip
    config["collections"] = {**given, null_source: None}
    validate(config, str(SCHEMA))
    assert config["collections"][null_source] is None


def test_evaluate_takes_its_batch_size_from_the_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate's forward passes hold config predict.batch_size samples, as predict's windows:
    its three literal 16s had restated that default; the functions state none."""
    from emb.evaluation import evaluate

    parser = stage_parser("emb.evaluation.evaluate", monkeypatch)
    (action,) = [a for a in parser._actions if a.dest == "batch_size"]
    key = KEY.search(action.help or "")
    assert key is not None and key[1] == "predict.batch_size", action.help
    assert parsed_default(action, action.default) == schema_default("predict.batch_size")
    for func in (evaluate.evaluate, evaluate.confusion_matrices):
        default = inspect.signature(func).parameters["batch_size"].default
        assert default in (None, inspect.Parameter.empty), f"{func.__name__}: {default!r}"

"""The seeds' recipe, pinned: a default that moves away from it must do so on purpose (with
its reason in the train schema's description and the README), and DeepLab's atrous rates fit the
tiles it is trained on (the ASPP input is tile/16 px)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO, TinyDemo
from training_runs import resolve_config, train_here

from emb.models import ModelConfig, aspp_rates_for
from emb.training import checkpoint_file
from emb.training.run_config import ConfigError
from emb.training.train_config import resolve

SCHEMA = REPO / "workflow/schemas/train.schema.yaml"
SEEDS = [  # section, key, the seeds' value
    ("ema", "decay", 0.9999),
    ("train", "save_every", 10),
    ("train", "val_bn_batch_stats", True),  # BatchNorm validates on batch statistics ...
    ("train", "val_min_batch", 2),  # ... and skips a batch of one sample
    ("model", "widths", [64, 128, 256, 512]),
    ("model", "decoder_dim", 256),
]


@pytest.mark.parametrize(("section", "key", "value"), SEEDS)
def test_the_schema_and_every_standard_run_keep_the_seeds_defaults(
    section: str, key: str, value: object
) -> None:
    schema = yaml.safe_load(SCHEMA.read_text())
    assert schema["properties"][section]["properties"][key]["default"] == value
    for run in ("aef_segformer", "aef_deeplab", "tessera_segformer", "tessera_deeplab"):
        files = [REPO / "config/train/defaults.yaml", REPO / f"config/train/{run}.yaml"]
        assert resolve(files, [], SCHEMA)[section][key] == value, run


@pytest.mark.parametrize(
    ("tile", "rates"), [(32, (1,)), (64, (1, 2, 3)), (256, (3, 6, 9)), (528, (6, 12, 18))]
)
def test_aspp_rates_derived_from_the_tile_read_real_pixels(tile: int, rates: tuple) -> None:
    assert aspp_rates_for(tile) == rates  # 528 px: DeepLab's own 33-px ASPP input
    assert ModelConfig("deeplab", 64).for_tile(tile).aspp_rates == rates


def test_every_derived_rate_stays_inside_the_aspp_input() -> None:
    for tile in range(16, 2049, 16):
        rates = aspp_rates_for(tile)
        assert rates == tuple(sorted(set(rates))) and min(rates) >= 1
        assert max(rates) <= max(1, tile // 16 - 1), tile


def test_explicit_rates_that_read_only_padding_are_refused() -> None:
    with pytest.raises(ValueError, match=r"aspp_rates: expected rates of at most 3 on 64-px"
                       r" tiles .*found \[6, 12, 18\]"):  # fmt: skip
        ModelConfig("deeplab", 64, aspp_rates=(6, 12, 18)).for_tile(64)
    assert ModelConfig("deeplab", 64, aspp_rates=(6, 12, 18)).for_tile(512).aspp_rates[-1] == 18


def test_a_deeplab_run_records_the_rates_of_its_tiles(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    config = resolve_config(tiny_demo, tmp_path / "run", "train.max_updates=1", arch="deeplab")
    assert yaml.safe_load(config.read_text())["model"]["aspp_rates"] is None
    train_here(config)
    saved = checkpoint_file.load(tmp_path / "run" / "last.pt")["config"]["model"]
    assert saved["aspp_rates"] == [1]  # 32-px tiles: a 2-px ASPP input
    bad = resolve_config(tiny_demo, tmp_path / "bad", "model.aspp_rates=[6, 12, 18]",
                         arch="deeplab")  # fmt: skip
    with pytest.raises(ConfigError, match=r"bad/config.yaml: model.aspp_rates: expected rates of"
                       r" at most 1 on 32-px tiles"):  # fmt: skip
        train_here(bad)


def test_a_resolved_config_lists_its_keys_in_the_schemas_order_whichever_file_set_them(
    tmp_path: Path,
) -> None:
    """The run's config.yaml reads the same way for every run: sections and keys in the
    schema's order, not in the order the merged files happened to give them."""
    late = tmp_path / "late.yaml"
    late.write_text("train: {shuffle_buffer: 64, patience: 3, epochs: 2}\n")
    files = [REPO / "config/train/defaults.yaml", REPO / "config/train/aef_deeplab.yaml", late]
    config = resolve(files, [], SCHEMA)
    schema = yaml.safe_load(SCHEMA.read_text())["properties"]
    assert list(config) == [k for k in schema if k in config]
    for section in ("train", "data", "model"):
        order = list(schema[section]["properties"])
        assert list(config[section]) == [k for k in order if k in config[section]], section

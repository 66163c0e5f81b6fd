"""Provenance: every result names the code, libraries, config and data that made it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from conftest import TinyDemo
from training_runs import resolve_config, train_here

from emb import provenance as prov
from emb.training import checkpoint_file


def test_the_block_names_commit_versions_digests_host_and_device() -> None:
    block = prov.provenance(config_digest="c" * 64, manifest_digest="m" * 64)
    assert re.fullmatch(r"[0-9a-f]{40}", block["git_commit"])  # tests run from a checkout
    assert block["git_dirty"] in ("true", "false")
    for name in prov.PACKAGES:
        assert block[f"{name}_version"] not in ("", prov.UNKNOWN), name
    assert (block["config_digest"], block["manifest_digest"]) == ("c" * 64, "m" * 64)
    assert block["host"] and block["device"] == "cpu"
    assert all(isinstance(v, str) for v in block.values())  # GeoTIFF tags, CSV cells


def test_config_digest_ignores_key_order_and_sees_every_value() -> None:
    a = {"model": {"arch": "segformer", "in_dim": 64}, "train": {"lr": 0.001}}
    b = {"train": {"lr": 0.001}, "model": {"in_dim": 64, "arch": "segformer"}}
    assert prov.digest_config(a) == prov.digest_config(b)
    assert prov.digest_config(a) != prov.digest_config({**a, "train": {"lr": 0.002}})


def test_train_json_and_checkpoints_carry_the_runs_provenance(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    config = resolve_config(tiny_demo, tmp_path / "run", "train.epochs=1")
    block = train_here(config)["provenance"]  # what train.json holds
    resolved = checkpoint_file.load(config.parent / "best.pt")["config"]
    assert block["config_digest"] == prov.digest_config(resolved)
    manifest = yaml.safe_load(config.read_text())["data"]["manifest"]
    assert block["manifest_digest"] == prov.digest_file(manifest)
    for name in ("best.pt", "last.pt"):
        state = checkpoint_file.load(config.parent / name)
        assert state["provenance"] == block, name
        assert state["run"] == "run", name

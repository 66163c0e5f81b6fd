"""Defaults live in the training schema; the dataclasses and the Trainer must not disagree."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import yaml
from conftest import REPO

from emb.training.run_config import SECTIONS, LoopConfig
from emb.training.trainer import Trainer

SCHEMA = yaml.safe_load((REPO / "workflow/schemas/train.schema.yaml").read_text())


def plain(value):
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_dataclass_default_is_the_schema_default(section: str) -> None:
    keys = SCHEMA["properties"][section]["properties"]
    checked = 0
    for f in dataclasses.fields(SECTIONS[section]):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            continue  # required: the schema or the workflow supplies it
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert f.name in keys, f"{section}.{f.name}: a dataclass field the schema does not know"
        assert "default" in keys[f.name], f"{section}.{f.name}: default only in the dataclass"
        assert plain(default) == keys[f.name]["default"], f"{section}.{f.name}"
        checked += 1
    assert checked > 0


def test_trainer_keyword_defaults_are_the_loop_config_defaults() -> None:
    loop = {f.name: f.default for f in dataclasses.fields(LoopConfig)}
    params = inspect.signature(Trainer).parameters
    resolved = ("grad_scaler", "channels_last")  # the Trainer takes them resolved: a bool
    shared = [n for n in params if n in loop and n not in resolved]
    assert {"precision", "grad_clip", "nonfinite_policy"} <= set(shared)
    assert all(isinstance(params[n].default, bool) for n in resolved)
    for name in shared:
        default = params[name].default
        if default is inspect.Parameter.empty:
            continue  # required: the caller passes the config's value
        assert default == loop[name], name
    assert params["precision"].default is inspect.Parameter.empty

"""Every training default is stated once, in workflow/schemas/train.schema.yaml (issue 52): the
dataclasses take theirs from it, the Trainer has none, config/train/defaults.yaml holds only
what differs from it, and config/config.yaml restates none of the config schema's defaults."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import yaml
from conftest import REPO

from emb.models import ModelConfig
from emb.models.train_defaults import schema_defaults, section_defaults
from emb.training.run_config import SECTIONS
from emb.training.trainer import Trainer

TRAIN_SCHEMA = yaml.safe_load((REPO / "workflow/schemas/train.schema.yaml").read_text())
CONFIG_SCHEMA = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())


def plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def field_defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = plain(f.default_factory())
    return out


def test_every_schema_section_is_read_into_a_dataclass() -> None:
    assert set(TRAIN_SCHEMA["properties"]) == set(SECTIONS)
    assert SECTIONS["model"] is ModelConfig


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_the_dataclass_defaults_are_the_schemas_and_only_they(section: str) -> None:
    """Each field defaults to the schema's value; a field the schema has no default for is
    required (a default of the dataclass's own would show as one the schema lacks)."""
    assert field_defaults(SECTIONS[section]) == section_defaults(section)


def test_a_dataclass_stating_a_default_of_its_own_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Loop.epochs: states a default of its own"):

        @schema_defaults("train")
        class Loop:
            epochs: int = 100


def test_the_trainer_has_no_defaults_of_its_own() -> None:
    """The Trainer takes the run's settings (its ``train:`` section) and runtime, nothing else
    that a default could stand for."""
    defaulted = [p.name for p in inspect.signature(Trainer).parameters.values()
                 if p.default is not inspect.Parameter.empty]  # fmt: skip
    assert defaulted == []


def leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict) or not data:
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out |= leaves(value, f"{prefix}.{key}" if prefix else key)
    return out


def schema_default(schema: dict, key: str) -> Any:
    node = schema
    for part in key.split("."):
        node = node.get("properties", {}).get(part, {})
    return node.get("default", inspect.Parameter.empty)


def test_defaults_yaml_holds_only_what_differs_from_the_schema() -> None:
    path = REPO / "config/train/defaults.yaml"
    stated = leaves(yaml.safe_load(path.read_text()) or {})
    again = sorted(k for k, v in stated.items() if k and v == schema_default(TRAIN_SCHEMA, k))
    assert again == [], f"{path}: the schema's defaults stated a second time: {again}"


def test_config_yaml_restates_no_default_of_the_schema() -> None:
    """config/config.yaml holds what differs from the config schema (the runs, the demo's
    tiling), not a second copy of a default a user might edit in one place only."""
    path = REPO / "config/config.yaml"
    config = yaml.safe_load(path.read_text())
    stated = leaves(config)
    again = sorted(k for k, v in stated.items() if v == schema_default(CONFIG_SCHEMA, k))
    assert again == [], f"{path}: the schema's defaults stated a second time: {again}"

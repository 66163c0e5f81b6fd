"""No dataclass of emb shares a mutable default between its instances (issue 59, item 7).

Python refuses a list, dict or set as a field's default, but not a tensor, a tuple holding a
list, an instance of a non-frozen class, nor a ``default_factory`` that hands out one object
every time (``lambda: WEIGHTS``, or the schema's dict without its copy). Every ``@dataclass``
under src/emb is found in the source and imported: each field's default must hold nothing
mutable, and two calls of its factory must share nothing mutable; the config dataclasses,
built twice, share no mutable field."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import PurePath
from typing import Any

import pytest
import torch
from conftest import REPO

from emb.evaluation.predict_spec import PredictSpec
from emb.models import ModelConfig
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec
from emb.training.run_config import SECTIONS

SRC = REPO / "src"
IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range, enum.Enum, PurePath, type)


def mutable_parts(value: Any) -> Iterator[Any]:
    """Every mutable object in ``value``: itself, or what a tuple, a frozenset or a frozen
    dataclass holds. An object of a type not known to be immutable counts as mutable."""
    if isinstance(value, IMMUTABLE) or inspect.isroutine(value):
        return
    if isinstance(value, tuple | frozenset):
        for item in value:
            yield from mutable_parts(item)
        return
    if dataclasses.is_dataclass(value):
        if not type(value).__dataclass_params__.frozen:
            yield value
        for f in dataclasses.fields(value):
            yield from mutable_parts(getattr(value, f.name))
        return
    yield value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from mutable_parts(key)
            yield from mutable_parts(item)
    elif isinstance(value, list | set):
        for item in value:
            yield from mutable_parts(item)


def shared(first: Any, second: Any) -> list[Any]:
    """The mutable objects ``first`` and ``second`` both hold (the same object, not equal)."""
    ids = {id(part) for part in mutable_parts(first)}
    return [part for part in mutable_parts(second) if id(part) in ids]


def dataclass_modules() -> list[str]:
    """The modules of src/emb whose source has a ``@dataclass``."""
    found = []
    for path in sorted((SRC / "emb").rglob("*.py")):
        if re.search(r"^\s*@(dataclasses\.)?dataclass\b", path.read_text(), re.MULTILINE):
            name = ".".join(path.relative_to(SRC).with_suffix("").parts)
            found.append(name.removesuffix(".__init__"))
    return found


def dataclasses_of(module: str) -> list[type]:
    mod = importlib.import_module(module)
    return [obj for obj in vars(mod).values()
            if inspect.isclass(obj) and dataclasses.is_dataclass(obj)
            and obj.__module__ == module]  # fmt: skip


MODULES = dataclass_modules()


def test_the_scan_finds_the_config_dataclasses() -> None:
    """The source scan reaches the dataclasses that hold a config (a scan that found none
    would pass everything)."""
    assert len(MODULES) > 20
    found = {cls for module in MODULES for cls in dataclasses_of(module)}
    assert {*SECTIONS.values(), PredictSpec, SplitSpec, TileSpec} <= found


@pytest.mark.parametrize("module", MODULES)
def test_no_field_default_is_shared_between_instances(module: str) -> None:
    wrong = []
    for cls in dataclasses_of(module):
        for f in dataclasses.fields(cls):
            where = f"{cls.__qualname__}.{f.name}"
            held: list[Any] = []
            if f.default is not dataclasses.MISSING:
                held = list(mutable_parts(f.default))  # one object for every instance
            elif f.default_factory is not dataclasses.MISSING:
                held = shared(f.default_factory(), f.default_factory())
            if held:
                wrong.append(f"{where}: every instance gets this {type(held[0]).__name__}")
    assert wrong == []


def test_a_shared_default_is_found() -> None:
    """The check itself: a tensor default (hashable, so Python allows it), a tuple holding a
    list, and a factory that returns one dict every time are each found."""
    weights = {"ce": 1.0}

    @dataclasses.dataclass
    class Bad:
        norm: torch.Tensor = torch.tensor(0.0)
        sizes: tuple = ([1],)
        weights: dict = dataclasses.field(default_factory=lambda: weights)
        fresh: dict = dataclasses.field(default_factory=lambda: dict(weights))

    norm, sizes, bad, fresh = dataclasses.fields(Bad)
    assert list(mutable_parts(norm.default)) == [norm.default]
    assert list(mutable_parts(sizes.default)) == [[1]]
    assert shared(bad.default_factory(), bad.default_factory()) == [weights]
    assert shared(fresh.default_factory(), fresh.default_factory()) == []


CONFIGS = [
    *(cls() for cls in SECTIONS.values() if cls not in (ModelConfig, SECTIONS["data"])),
    ModelConfig(arch="segformer", in_dim=64),
    SECTIONS["data"](source="aef"),
    PredictSpec(tile=64),
    SplitSpec(block_m=1000.0),
    TileSpec(size=64),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).__name__)
def test_a_config_built_twice_shares_no_mutable_field(config: Any) -> None:
    """Built as a run builds it, from its defaults: the second instance's fields (a loss's
    weights, a split's fractions) are its own."""
    required = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}  # fmt: skip
    again = type(config)(**required)
    assert again == config
    for f in dataclasses.fields(config):
        if f.name not in required:
            assert shared(getattr(config, f.name), getattr(again, f.name)) == [], f.name


def test_the_schema_dict_defaults_are_copied_per_instance() -> None:
    """A dict of the training schema (the loss's weights) is a fresh copy for each config: a
    change to one run's never reaches another's."""
    LossConfig = SECTIONS["loss"]
    first, second = LossConfig(), LossConfig()
    assert first.weights and first.weights == second.weights
    assert first.weights is not second.weights

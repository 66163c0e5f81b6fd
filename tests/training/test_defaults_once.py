"""Every training default is stated once, in workflow/schemas/train.schema.yaml (issue 52): the
dataclasses take theirs from it, the Trainer has none, config/train/defaults.yaml holds only
what differs from it, and config/config.yaml restates none of the config schema's defaults.
No component states a literal default under a setting's name of either schema, equal to the
schema's (a second copy) or not (a drifted one, issue 56)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from conftest import REPO

from emb.config_schema import config_default
from emb.evaluation.predict_spec import PredictSpec
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


# Parameters that take a train schema setting under another name.
RENAMED = {
    "policy": ["train.nonfinite_policy"],
    "max_in_row": ["train.max_nonfinite_in_row"],
    "every_updates": ["train.val_every_updates", "train.checkpoint_every_updates"],
    "save_every_epochs": ["train.save_every"],
    "bn_batch_stats": ["train.val_bn_batch_stats"],
    "min_batch": ["train.val_min_batch"],
}
# (module, name): a literal default under a setting's name that does not stand for the
# setting (equal to its default by coincidence, or another value of its own); each with why.
# Short on purpose: removing the default (the caller passes the config's) is the usual answer.
NOT_SETTINGS = {
    ("emb/evaluation/bootstrap.py", "seed"): "the bootstrap's own seed, not train.seed",
    ("emb/models/deeplab.py", "drop_path"): "a block's own rate (from drop_path_rates), not "
    "model.drop_path, the rate of the deepest block, which the model's builder passes on",
    ("emb/models/segformer.py", "drop_path"): "a block's own rate, as in deeplab.py",
}
# Config schema leaves the code uses as plain words for other things (a raster's block, a
# confidence level, a count, a tile's size, a process's threads, a thing's name, an embedding
# source beside districts.source): a literal under one of these names is not read as the
# setting. The train schema's names are all distinctive enough.
GENERIC_CONFIG_NAMES = {"n", "size", "seed", "block", "level", "threads", "workers", "name",
                        "source"}  # fmt: skip


def train_settings() -> dict[str, list[tuple[str, Any]]]:
    """{parameter name: [(schema key, default)]}: every setting with a default other than
    null (an optional parameter's None means "not given", not a stated value)."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for section, node in TRAIN_SCHEMA["properties"].items():
        for key, prop in node.get("properties", {}).items():
            if prop.get("default") is not None:
                out.setdefault(key, []).append((f"{section}.{key}", prop["default"]))
    for name, keys in RENAMED.items():
        out.setdefault(name, []).extend((k, schema_default(TRAIN_SCHEMA, k)) for k in keys)
    return out


def config_settings(node: dict | None = None, prefix: str = "") -> dict[str, list[tuple[str, Any]]]:
    """The config schema's settings as :func:`train_settings` gives the train schema's: the
    leaves inside its sections (predict.batch_size, area_estimates.sample.min_per_class; not
    the top-level inputs), but for :data:`GENERIC_CONFIG_NAMES`."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for key, prop in (node or CONFIG_SCHEMA).get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        if prop.get("type") == "object" or "properties" in prop:
            for name, found in config_settings(prop, path).items():
                out.setdefault(name, []).extend(found)
        elif prefix and key not in GENERIC_CONFIG_NAMES and prop.get("default") is not None:
            out.setdefault(key, []).append((path, prop["default"]))
    return out


def settings() -> dict[str, list[tuple[str, Any]]]:
    """Every setting a stage or component takes, by the name a parameter or field has."""
    out = train_settings()
    for name, found in config_settings().items():
        out.setdefault(name, []).extend(found)
    return out


def literal_defaults(tree: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """(name, default) of every function's parameter and every class's annotated field."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            positional = args.posonlyargs + args.args
            yield from zip(
                [a.arg for a in positional[len(positional) - len(args.defaults) :]],
                args.defaults,
                strict=True,
            )
            given = zip(args.kwonlyargs, args.kw_defaults, strict=True)
            yield from ((a.arg, d) for a, d in given if d is not None)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                field = isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                if field and item.value is not None:
                    yield item.target.id, item.value


def same(value: Any, default: Any) -> bool:
    """Equal as settings (True is not 1, a tuple states a list)."""
    return isinstance(value, bool) == isinstance(default, bool) and plain(value) == default


def stated_settings() -> Iterator[tuple[str, int, str, Any, list[tuple[str, Any]]]]:
    """(module, line, name, value, [(schema key, default)]) of every literal default (a
    parameter's or a field's) under a setting's name, but for NOT_SETTINGS: read from the
    source with ``ast``, nothing imported."""
    found, src = settings(), REPO / "src"
    for path in sorted((src / "emb").rglob("*.py")):
        module = path.relative_to(src).as_posix()
        for name, node in literal_defaults(ast.parse(path.read_text(), str(path))):
            if name not in found or (module, name) in NOT_SETTINGS:
                continue
            try:
                value = ast.literal_eval(node)
            except (ValueError, TypeError):
                continue  # computed (e.g. a default_factory reading the schema)
            yield module, node.lineno, name, value, found[name]


def test_no_component_restates_a_default() -> None:
    """A loss, EMA, guard, schedule, loader or stage function taking a setting must be given
    it (training/loop passes the config's, a stage its argument): a literal default equal to
    the schema's is a second copy a tune of the schema would miss, as label_smoothing=0.05 and
    shuffle_buffer=256 were (issue 52)."""
    again = [
        f"src/{module}:{line}: {name}={value!r} restates {key}'s default"
        for module, line, name, value, keys in stated_settings()
        for key, default in keys
        if same(value, default)
    ]
    assert again == [], "\n".join(again)


def test_no_component_states_a_drifted_default() -> None:
    """A literal default under a setting's name that matches none of the schema's defaults
    for that name is a copy that has drifted (issue 56: runtime's precision="fp32" against
    train.precision's bf16): a caller that leaves it out runs with other settings than the
    workflow's. None is "not given", not a value; a name that is not the setting goes in
    NOT_SETTINGS with why."""
    drifted = [
        f"src/{module}:{line}: {name}={value!r}, the schema's "
        + ", ".join(f"{key}: {default!r}" for key, default in keys)
        for module, line, name, value, keys in stated_settings()
        if value is not None and not any(same(value, default) for _, default in keys)
    ]
    assert drifted == [], (
        "literal defaults under a setting's name that differ from the schema's (take the "
        "setting from the caller, or list (module, name) in NOT_SETTINGS saying why it is "
        "not the setting):\n" + "\n".join(drifted)
    )


def test_predict_spec_takes_the_config_schemas_defaults() -> None:
    """PredictSpec states no default of its own: each is config predict.<field>'s, read when
    a spec is made."""
    given = {f.name: f for f in dataclasses.fields(PredictSpec)}
    for name in ("overlap", "block", "batch_size"):
        assert given[name].default is dataclasses.MISSING, f"PredictSpec.{name}: a literal default"
    assert dataclasses.asdict(PredictSpec(64)) == {
        "tile": 64,
        **{k: config_default(f"predict.{k}") for k in ("overlap", "block", "batch_size")},
    }

"""The training schema's defaults, given to the dataclasses a run's config is read into.

``workflow/schemas/train.schema.yaml`` states every training default once: Snakemake fills
them into each run's ``config.yaml``, and :func:`schema_defaults` makes them the defaults of
the fields of :class:`~emb.models.ModelConfig` and of the sections in
:mod:`emb.training.run_config`, which state none of their own (so pure code and tests that
build a config without the workflow get what a run gets). emb runs from its checkout, so the
schema lies three folders above this module (src/emb/models/).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from emb.config_schema import read_schema

TRAIN_SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "train.schema.yaml"

C = TypeVar("C", bound=type)


def section_defaults(section: str, schema: Path = TRAIN_SCHEMA) -> dict[str, Any]:
    """``{key: default}`` of the schema's ``section`` (``train``, ``model``, ...), for the keys
    that have one; a copy, so a caller may change it."""
    keys = read_schema(schema)["properties"][section]["properties"]
    return {k: copy.deepcopy(v["default"]) for k, v in keys.items() if "default" in v}


def schema_defaults(section: str, tuples: tuple[str, ...] = ()) -> Any:
    """A class decorator, placed under ``@dataclass``: each annotated field of the class takes
    the schema's default of ``section.<field>`` (lists named in ``tuples`` as tuples; a dict as
    a fresh copy per instance); a field the schema has no default for stays required."""

    def give(cls: C) -> C:
        defaults = section_defaults(section)
        for name in cls.__dict__.get("__annotations__", {}):
            if name in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__}.{name}: states a default of its own; the training "
                    f"schema ({TRAIN_SCHEMA}) holds every default"
                )
            if name not in defaults:
                continue
            value = defaults[name]
            if name in tuples and isinstance(value, list):
                value = tuple(value)
            if isinstance(value, dict | list):
                value = dataclasses.field(default_factory=lambda v=value: copy.deepcopy(v))
            setattr(cls, name, value)
        return cls

    return give

"""The workflow's configuration defaults, read from ``workflow/schemas/config.schema.yaml``.

The schema states each setting's default once; a stage's command line run by hand and the
dataclasses a caller builds without the workflow take theirs from here, so that they can never
drift from what a run of the workflow gets (they did: ``--tile-size 64`` against the config's
256). emb runs from its checkout (the rules put its ``src/`` first on the jobs' PYTHONPATH), so
the schema lies two folders above this module (src/emb/).
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from emb.io import parse_yaml

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


class SchemaError(LookupError):
    """A schema is missing, or has no default for a key the code asks for."""


@cache
def read_schema(path: Path) -> dict:
    """A schema of workflow/schemas/ (config or train), read once; :class:`SchemaError` naming
    the file when it cannot be read."""
    try:
        return parse_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise SchemaError(
            f"{path}: the schema (every setting's default) cannot be read: {err}"
        ) from None


def config_default(key: str, schema: Path = SCHEMA) -> Any:
    """The schema's default of ``key``, dotted as in config.yaml (``tiles.size``,
    ``collections.workers``); a copy, so a caller may change it."""
    node: Any = read_schema(schema)
    for part in key.split("."):
        properties = node.get("properties", {}) if isinstance(node, dict) else {}
        if part not in properties:
            raise SchemaError(f"{schema}: expected a setting {key!r}, found no {part!r}")
        node = properties[part]
    if "default" not in node:
        raise SchemaError(f"{schema}: expected a default for {key!r}, found none")
    return copy.deepcopy(node["default"])


def config_option(key: str, what: str = "") -> dict[str, Any]:
    """``add_argument`` keywords of a stage option that is config ``key``: the schema's default,
    and a help naming the key (which tests/workflow/test_stage_defaults.py reads back). A
    single default goes as text, which argparse parses with the option's type as it parses
    the value a rule passes (``0`` for a float option is ``0.0``)."""
    default = config_default(key)
    return {
        "default": str(default) if _scalar(default) else default,
        "help": f"{what + ': ' if what else ''}config {key} (default: %(default)s)",
    }


def _scalar(value: object) -> bool:
    return isinstance(value, int | float | str) and not isinstance(value, bool)

"""The crop-area settings (config ``area_estimates``) as one object: built once, from the config
at parse time or from the ``--settings`` a rule passes, checked once where it enters (against
the config schema's ``area_estimates`` section, which gives every default), and handed whole to
the design, the check, the table, the figure and the summary.

Only what the stages use travels: the interval's level, the sample's design and the check's
draws. Which regions a sample covers and where a labelled one lies are decisions of the DAG
(:mod:`emb.workflow.samples`), not of a stage.
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from emb.config_schema import SCHEMA, read_schema
from emb.estimation.estimators import z_of

SECTION = "area_estimates"
TRAVELS = ("confidence", "sample", "draws", "districts")  # the keys a stage reads
AUTO = "auto"  # sample.n: the recommended units
HELP = (
    "config area_estimates as JSON (the rule passes it whole; keys left out: the schema's defaults)"
)


class AreaSettingsError(ValueError):
    """Area settings that are not what the config schema allows: the key, expected, found."""


@dataclass(frozen=True)
class AreaSettings:
    """``confidence``: the two-sided level of every interval; the sample design (``n`` units,
    at least ``min_per_class`` per stratum, strata = the map's classes at ``level``, drawn from
    ``seed``; ``n`` "auto": as many as give each class with ``min_share`` of the mapped area a
    relative half-width of ``target``); ``draws``: the test split's check's seeded samples;
    ``district_source``: where the districts come from (``file``, ``areas``, ``regions``:
    :func:`emb.estimation.districts.load_districts`); ``districts``: the districts file, or with
    ``areas`` the areas file (None: none), ``district_name`` its field naming each district
    (travelling, so the stage reads the file the DAG checked)."""

    confidence: float
    n: int | str
    min_per_class: int
    level: int
    seed: int
    draws: int
    target: float
    min_share: float
    districts: str | None
    district_name: str
    district_source: str

    @property
    def auto(self) -> bool:
        """``n: auto``: the units :mod:`emb.estimation.sample_size` recommends."""
        return self.n == AUTO

    @property
    def has_districts(self) -> bool:
        """Whether the areas are also estimated per district (a file, the areas or regions)."""
        return self.district_source != "file" or self.districts is not None

    @property
    def z(self) -> float:
        """The normal quantile of the two-sided level, e.g. 1.959964 for 0.95."""
        return z_of(self.confidence)

    @property
    def percent(self) -> str:
        """The level as a label reads it: ``95%``, ``90%``, ``99.5%``."""
        return f"{self.confidence * 100:.10g}%"

    def to_json(self) -> str:
        """The settings as the config section holds them (what a rule passes as --settings)."""
        sample = {"n": self.n, "min_per_class": self.min_per_class, "level": self.level,
                  "seed": self.seed, "target": self.target,
                  "min_share": self.min_share}  # fmt: skip
        districts = {"file": self.districts, "name": self.district_name,
                     "source": self.district_source}  # fmt: skip
        return json.dumps(
            {"confidence": self.confidence, "sample": sample, "draws": self.draws,
             "districts": districts},
            sort_keys=True,
        )  # fmt: skip


def from_config(section: Mapping[str, Any], where: str = "config") -> AreaSettings:
    """The settings of a config's ``area_estimates`` section (keys it omits: the schema's
    defaults; the DAG's keys stay behind)."""
    return _build({k: copy.deepcopy(v) for k, v in section.items() if k in TRAVELS}, where)


def _build(data: dict, where: str) -> AreaSettings:
    """The one check: :class:`AreaSettingsError` naming the key, the expected and the found."""
    schema = read_schema(SCHEMA)["properties"][SECTION]
    wanted = {**schema, "properties": {k: schema["properties"][k] for k in TRAVELS},
              "additionalProperties": False}  # fmt: skip
    _fill_defaults(data, wanted)
    error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(wanted).iter_errors(data))
    if error is not None:
        key = ".".join([SECTION, *map(str, error.absolute_path)])
        message = error.message
        if error.validator == "oneOf":  # name what would do, not "under any of the schemas"
            allowed = " or ".join(json.dumps(option) for option in error.validator_value)
            message = f"expected {allowed}, found {error.instance!r}"
        raise AreaSettingsError(f"{where}: {key}: {message}")
    sample = data["sample"]
    return AreaSettings(
        confidence=float(data["confidence"]), n=sample["n"],
        min_per_class=sample["min_per_class"], level=sample["level"], seed=sample["seed"],
        draws=data["draws"], target=float(sample["target"]), min_share=float(sample["min_share"]),
        districts=data["districts"]["file"], district_name=data["districts"]["name"],
        district_source=data["districts"]["source"],
    )  # fmt: skip


def from_json(text: str, where: str = "--settings") -> AreaSettings:
    """The settings a rule passed (:meth:`AreaSettings.to_json`), or a section written by hand."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise AreaSettingsError(
            f"{where}: expected a JSON object, found {text!r} ({err})"
        ) from None
    if not isinstance(data, dict):
        raise AreaSettingsError(f"{where}: expected a JSON object, found {text!r}")
    return _build(data, where)


def _fill_defaults(data: dict, schema: Mapping[str, Any]) -> None:
    """Each key the data omits takes the schema's default, object sections key by key."""
    for key, prop in schema.get("properties", {}).items():
        if key not in data and "default" in prop:
            data[key] = copy.deepcopy(prop["default"])
        if prop.get("type") == "object" and isinstance(data.get(key), dict):
            _fill_defaults(data[key], prop)


def add_option(parser: argparse.ArgumentParser, flag: str = "--settings") -> None:
    """A stage's option for the settings a rule passes whole (the schema's when left out)."""
    parser.add_argument(flag, default="{}", help=HELP)


def parsed_option(
    parser: argparse.ArgumentParser, text: str, flag: str = "--settings"
) -> AreaSettings:
    """The option's settings; a bad one refused by ``parser`` in one line (exit 2)."""
    try:
        return from_json(text, flag)
    except AreaSettingsError as err:
        parser.error(str(err))

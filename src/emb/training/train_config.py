"""Stage: resolve one run's training configuration into ``results/runs/{run}/config.yaml``.

Resolution order: ``config/train/defaults.yaml`` <- ``config/train/{run}.yaml`` <- overlays
(demo, cluster) <- ``key.path=value`` overrides. Each file is checked against
``workflow/schemas/train.schema.yaml`` on its own (keys and types; a file holds part of a
config, so required keys are not asked of it), so an error names the file and the key; the
merged dict is then validated once more with the schema's defaults filled in (as Snakemake's
``validate(..., set_default=True)`` fills them, on the schema already parsed) and read into
:class:`~emb.training.run_config.TrainConfig` for cross-key rules. The workflow runs this for
every run before any job starts (:mod:`emb.workflow.parsed_runs`).
"""

from __future__ import annotations

import argparse
import copy
import logging
from pathlib import Path

import yaml

from emb import stage_runner
from emb.io import atomic_path, parse_yaml, read_yaml
from emb.training.run_config import ConfigError, TrainConfig

log = logging.getLogger(__name__)


def deep_merge(base: dict, update: dict) -> dict:
    """``update`` over ``base``: dicts merge key by key, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_override(config: dict, override: str) -> dict:
    """``a.b.c=value`` (value parsed as YAML) applied to a copy of ``config``."""
    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected key.path=value")
    path, raw = override.split("=", 1)
    update: dict = {}
    node = update
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    try:
        node[leaf] = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"override {override!r}: the value is not valid YAML ({err})") from err
    return deep_merge(config, update)


def _without_required(schema: object) -> object:
    """``schema`` with every ``required`` list dropped: what one file of a config must obey."""
    if isinstance(schema, dict):
        return {k: _without_required(v) for k, v in schema.items() if k != "required"}
    if isinstance(schema, list):
        return [_without_required(v) for v in schema]
    return schema


def schema_error(config: dict, schema: dict) -> str | None:
    """The first schema violation in ``config``, naming the key, what was found and what was
    expected (jsonschema's own words, which say both)."""
    import jsonschema  # comes with snakemake

    errors = jsonschema.Draft202012Validator(schema).iter_errors(config)
    error = min(errors, key=lambda e: [str(p) for p in e.absolute_path], default=None)
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        keys = ", ".join(f"{where}.{k}" if where else k for k in unknown)
        return f"unknown key {keys} ({error.message}); expected one of {allowed}"
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        keys = ", ".join(f"{where}.{k}" if where else k for k in missing)
        return f"missing key {keys} ({error.message})"
    return f"{where or 'top level'}: {error.message}"  # e.g. -4 is less than the minimum of 1


def fill_defaults(config: dict, schema: dict) -> None:
    """Validate ``config`` against ``schema``, setting each missing property that has a
    ``default`` (jsonschema's FAQ recipe, as Snakemake's ``validate(..., set_default=True)``).
    Why not Snakemake's: it reparses the schema file with pure-Python YAML on every call
    (~0.1-0.3 s, 90% of a resolution; a parse of the workflow resolves each run twice)."""
    import jsonschema  # comes with snakemake

    base = jsonschema.Draft202012Validator
    check_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, subschema):  # noqa: ANN001, ANN202
        if isinstance(instance, dict):
            for name, rule in properties.items():
                if "default" in rule:
                    instance.setdefault(name, copy.deepcopy(rule["default"]))
        yield from check_properties(validator, properties, instance, subschema)

    filling = jsonschema.validators.extend(base, {"properties": set_defaults})
    error = jsonschema.exceptions.best_match(filling(schema).iter_errors(config))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "top level"
        raise ConfigError(f"{where}: {error.message}")


def in_schema_order(config: dict, schema: dict) -> dict:
    """``config`` with its keys in the schema's order at every level (keys the schema does not
    list after them, as given): a resolved config reads the same whichever file set a key."""
    known = schema.get("properties", {})
    ordered = [k for k in known if k in config] + [k for k in config if k not in known]
    return {
        k: in_schema_order(config[k], known[k])
        if isinstance(config[k], dict) and k in known
        else config[k]
        for k in ordered
    }


def resolve(files: list[Path], overrides: list[str], schema: Path) -> dict:
    """Merge the YAML ``files`` in order, apply ``overrides``, validate and fill defaults."""
    rules = parse_yaml(Path(schema).read_text())
    per_file = _without_required(rules)
    config: dict = {}
    for path in files:
        loaded = read_yaml(path, ConfigError) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        if problem := schema_error(loaded, per_file):
            raise ConfigError(f"{path}: {problem} (schema {schema})")
        config = deep_merge(config, loaded)
    for override in overrides:
        config = apply_override(config, override)
    if problem := schema_error(config, rules):
        where = " <- ".join([*map(str, files), *(f"--set {o}" for o in overrides)])
        raise ConfigError(f"{where}: {problem} (schema {schema})")
    fill_defaults(config, rules)
    TrainConfig.from_dict(config, " <- ".join(str(f) for f in files))  # cross-key rules
    return in_schema_order(config, rules)


@stage_runner.stage
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Resolve a run's training configuration.")
    parser.add_argument("files", type=Path, nargs="+", help="YAML files, later ones win")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE"
    )
    parser.add_argument("--schema", type=Path, default=Path("workflow/schemas/train.schema.yaml"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    config = resolve(args.files, args.overrides, args.schema)
    with atomic_path(args.out) as tmp:
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()

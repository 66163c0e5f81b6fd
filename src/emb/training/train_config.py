"""Stage: resolve one run's training configuration into ``results/runs/{run}/config.yaml``.

Resolution order: ``config/train/defaults.yaml`` <- ``config/train/{run}.yaml`` <- overlays
(demo, cluster) <- ``key.path=value`` overrides. The merged dict is validated against
``workflow/schemas/train.schema.yaml`` by Snakemake's own validator (unknown keys rejected,
defaults filled), then read into :class:`~emb.training.config.TrainConfig` for cross-key rules.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import yaml

from emb.io import atomic_path
from emb.training.config import ConfigError, TrainConfig


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
    node[leaf] = yaml.safe_load(raw)
    return deep_merge(config, update)


def resolve(files: list[Path], overrides: list[str], schema: Path) -> dict:
    """Merge the YAML ``files`` in order, apply ``overrides``, validate and fill defaults."""
    from snakemake.utils import validate  # the workflow's validator, defaults included

    config: dict = {}
    for path in files:
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        config = deep_merge(config, loaded)
    for override in overrides:
        config = apply_override(config, override)
    validate(config, str(schema), set_default=True)
    TrainConfig.from_dict(config, " <- ".join(str(f) for f in files))  # cross-key rules
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Resolve a run's training configuration.")
    parser.add_argument("files", type=Path, nargs="+", help="YAML files, later ones win")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE"
    )
    parser.add_argument("--schema", type=Path, default=Path("workflow/schemas/train.schema.yaml"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        config = resolve(args.files, args.overrides, args.schema)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    with atomic_path(args.out) as tmp:
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

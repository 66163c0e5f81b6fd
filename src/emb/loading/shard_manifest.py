"""The shard manifest (``results/shards/{source}/manifest.json``, written by the manifest stage)
as every stage that consumes it reads it: checked once, refused naming the file."""

from __future__ import annotations

import json
from pathlib import Path


class ManifestError(ValueError):
    """Region indexes that cannot form one manifest, or a file that is not a manifest."""


def read_manifest(
    path: Path, splits: tuple[str, ...] = ("train", "val"), keys: tuple[str, ...] = ("in_dim",)
) -> dict:
    """The shard manifest at ``path``, refused naming the file when it is not one (every stage
    that consumes a manifest reads it here)."""
    try:
        manifest = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ManifestError(f"{path}: not a JSON shard manifest ({err}); rebuild it") from err
    found = manifest.get("splits") if isinstance(manifest, dict) else None
    missing = [k for k in splits if not isinstance(found, dict) or k not in found]
    if not isinstance(manifest, dict) or not set(keys) <= set(manifest) or missing:
        raise ManifestError(
            f"{path}: expected a shard manifest with {' and '.join(keys)} and splits "
            f"{' and '.join(splits)}, "
            f"found keys {sorted(manifest) if isinstance(manifest, dict) else type(manifest)}"
        )
    return manifest

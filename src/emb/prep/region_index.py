"""``index.json``: a region's shard index (``results/shards/{source}/{region}/index.json``),
written by the shards stage and read by the manifest, the data report and the test split's
check. One module for the format: its keys, the tile key ``{region}_{row}_{col}`` built and
parsed, the writer and the readers.

The index says what the region's tiles are (``tile_size``, ``in_dim``, ``dtype``), the tiles
dropped per split and why, the labels the kept tiles cover (``label_coverage``), and per split
its shards, samples, class histogram and ``blocks`` (tile key -> spatial block).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rasterio.windows import Window

from emb.io import read_json, write_json
from emb.loading.shard_manifest import ManifestError

INDEX_KEYS = ("source", "region", "in_dim", "tile_size", "dtype", "dropped", "splits")
FIX = "rebuild it (snakemake --forcerun shards)"


class RegionIndexError(ManifestError):
    """A region index that is not one, or a tile key that names no tile."""


def tile_key(region: str, row: int, col: int) -> str:
    """A tile's key (the shards' ``__key__`` and the index's ``blocks``): ``{region}_{row}_{col}``,
    its top-left pixel; the region's name may hold underscores itself."""
    return f"{region}_{row}_{col}"


def tile_origin(key: str, where: Path | str) -> tuple[int, int]:
    """(row, col) of a tile key; :class:`RegionIndexError` naming ``where`` for another form."""
    parts = str(key).rsplit("_", 2)
    try:
        return int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        raise RegionIndexError(
            f"{where}: splits.test.blocks: expected keys {{region}}_{{row}}_{{col}}, found {key!r}"
        ) from None


def new_index(
    source: str, region: str, in_dim: int, tile_size: int, split_group: str,
    dropped: Mapping[str, Counter[str]], coverage: Mapping[str, Mapping[str, float]],
) -> dict[str, Any]:  # fmt: skip
    """The region's index before its shards are written (their entries go under ``splits``):
    what its tiles are, the tiles dropped per split and reason, the labels they cover."""
    return {
        "source": source,
        "region": region,
        "in_dim": in_dim,
        "tile_size": tile_size,
        "dtype": "int8",
        "split_group": split_group,
        "dropped": {split: dict(reasons) for split, reasons in dropped.items()},
        "label_coverage": coverage,
        "splits": {},
    }


def write_index(path: Path, index: Mapping[str, Any]) -> None:
    """The index as JSON at ``path`` (the shards stage stages it, then renames it in place)."""
    write_json(path, index)


def read_index(path: Path | str, keys: tuple[str, ...] = INDEX_KEYS) -> dict[str, Any]:
    """A region index, refused in one line naming the file when it is not JSON or lacks one of
    ``keys``."""
    index = read_json(path, "JSON region index", FIX)
    missing = [k for k in keys if not isinstance(index, dict) or k not in index]
    if missing:
        raise RegionIndexError(
            f"{path}: expected a region index with keys {list(keys)}, missing {missing}"
        )
    return index


def windows_of_test_tiles(index: Mapping[str, Any], path: Path | str) -> list[Window]:
    """The test tiles of a region's index (``splits.test.blocks`` keys, ``tile_size``) as pixel
    windows."""
    try:
        size = int(index["tile_size"])
        keys = index["splits"]["test"]["blocks"]
    except (KeyError, TypeError, ValueError) as err:
        raise RegionIndexError(
            f"{path}: expected a shard index with tile_size and splits.test.blocks, found no {err}"
        ) from None
    windows = []
    for key in keys:
        row, col = tile_origin(key, path)
        windows.append(Window(col, row, size, size))
    return windows


def label_coverage(path: Path) -> tuple[str, dict] | None:
    """(region, its ``label_coverage``) of the index at ``path``; None for an index built
    before it was recorded, or no index."""
    if not path.is_file():
        return None
    index = read_index(path, ("region",))
    return (index["region"], index["label_coverage"]) if "label_coverage" in index else None

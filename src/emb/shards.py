"""Stage: cut one region's tiles and write them as WebDataset shards, per split.

A sample (DESIGN.md section 5): ``__key__`` = ``{region}_{row}_{col}``, ``emb.npy`` (D, T, T)
int8, ``label.npy`` (T, T) uint8 L3 (255 = ignore), ``meta.json``; TESSERA adds ``scale.npy``
(T, T) float32. Each shard is written to a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import rasterio
import webdataset as wds

from emb.classes import IGNORE, N_L3
from emb.io import atomic_path, write_json
from emb.rasters import BANDS, shard_arrays
from emb.tiles import SPLITS, SplitSpec, Tile, TileSpec, plan_tiles


def encode_npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def tile_samples(
    source: str, region: str, emb: rasterio.DatasetReader, labels: np.ndarray, tiles: list[Tile]
) -> Iterator[dict[str, bytes | str]]:
    """Encoded WebDataset samples of ``tiles``, read window by window."""
    for tile in tiles:
        win = tile.window
        arrays = shard_arrays(source, emb.read(window=win), emb.nodata)
        arrays["label"] = labels[tile.row : tile.row + tile.size, tile.col : tile.col + tile.size]
        meta = {
            "region": region,
            "source": source,
            "window": [tile.col, tile.row, tile.size, tile.size],
            "crs": emb.crs.to_string(),
            "transform": list(emb.window_transform(win))[:6],
        }
        sample: dict[str, bytes | str] = {"__key__": f"{region}_{tile.row}_{tile.col}"}
        sample.update({f"{name}.npy": encode_npy(a) for name, a in arrays.items()})
        sample["meta.json"] = json.dumps(meta).encode()
        yield sample


def write_shards(
    samples: Iterator[dict], pattern: str, max_samples: int, max_bytes: int
) -> list[dict]:
    """Write samples into ``pattern % n`` shards; returns [{path, samples, bytes}] per shard."""
    shards: list[dict] = []
    batch: list[dict] = []
    size = 0

    def flush() -> None:
        path = Path(pattern % len(shards))
        with atomic_path(path) as tmp, wds.TarWriter(str(tmp), encoder=False) as sink:
            for s in batch:
                sink.write(s)
        shards.append({"path": str(path), "samples": len(batch), "bytes": path.stat().st_size})

    for sample in samples:
        batch.append(sample)
        size += sum(len(v) for k, v in sample.items() if k != "__key__")
        if len(batch) >= max_samples or size >= max_bytes:
            flush()
            batch, size = [], 0
    if batch:
        flush()
    return shards


def build_region(
    source: str,
    region: str,
    emb_path: Path,
    label_path: Path,
    out_dir: Path,
    tile_spec: TileSpec,
    split_spec: SplitSpec,
    fixed_split: str | None = None,
    max_samples: int = 256,
    max_bytes: int = 1 << 30,
) -> dict:
    """Shards of one region for every split; returns the region's index (see manifest)."""
    with rasterio.open(label_path) as src:
        labels = src.read(1)
        transform = src.transform
    tiles, dropped = plan_tiles(labels, transform, region, tile_spec, split_spec, fixed_split)
    index = {
        "source": source,
        "region": region,
        "in_dim": BANDS[source],
        "tile_size": tile_spec.size,
        "dropped": dict(dropped),
        "splits": {},
    }
    with rasterio.open(emb_path) as emb:
        if emb.count != BANDS[source]:
            raise ValueError(
                f"{emb_path}: expected {BANDS[source]} bands for {source}, found {emb.count}"
            )
        index["dtype"] = "int8"
        for split in SPLITS:
            chosen = [t for t in tiles if t.split == split]
            hist = np.zeros(N_L3, np.int64)
            for t in chosen:
                patch = labels[t.row : t.row + t.size, t.col : t.col + t.size]
                hist += np.bincount(patch[patch != IGNORE], minlength=N_L3)[:N_L3]
            samples = tile_samples(source, region, emb, labels, chosen)
            shards = write_shards(
                samples, str(out_dir / f"{split}-%04d.tar"), max_samples, max_bytes
            )
            n = sum(s["samples"] for s in shards)
            index["splits"][split] = {
                "shards": shards,
                "samples": n,
                "labelled_pixels": int(hist.sum()),
                "class_hist": hist.tolist(),
                "bytes_per_sample": sum(s["bytes"] for s in shards) / n if n else 0,
            }
    return index


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, choices=sorted(BANDS))
    parser.add_argument("--region", required=True)
    parser.add_argument("--emb", type=Path, required=True)
    parser.add_argument("--labels", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True, help="output: region index JSON")
    parser.add_argument("--tile-size", type=int, default=64)
    parser.add_argument("--stride", type=int, default=None)
    parser.add_argument("--min-valid", type=float, default=0.25)
    parser.add_argument("--block-m", type=float, default=1280.0)
    parser.add_argument(
        "--fractions",
        type=float,
        nargs=3,
        default=(0.7, 0.15, 0.15),
        metavar=("TRAIN", "VAL", "TEST"),
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--buffer-m", type=float, default=0.0)
    parser.add_argument("--split", default="", help="whole region in one split (regions.tsv)")
    parser.add_argument("--max-samples", type=int, default=256)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    args = parser.parse_args(argv)
    fixed = args.split if args.split in SPLITS else None
    index = build_region(
        args.source,
        args.region,
        args.emb,
        args.labels,
        args.index.parent,
        TileSpec(args.tile_size, args.stride, args.min_valid),
        SplitSpec(
            args.block_m, dict(zip(SPLITS, args.fractions, strict=True)), args.seed, args.buffer_m
        ),
        fixed,
        args.max_samples,
        args.max_bytes,
    )
    write_json(args.index, index)
    counts = {s: v["samples"] for s, v in index["splits"].items()}
    print(f"{args.source}/{args.region}: samples {counts}, dropped {index['dropped']}")


if __name__ == "__main__":
    main()

"""Per-block confusion matrices: gathered over ranks, stacked, written, read, and turned into
the intervals of metrics.json (the block bootstrap of :mod:`emb.evaluation.bootstrap`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch.distributed as dist

from emb.evaluation.bootstrap import BootstrapSettings, block_intervals
from emb.evaluation.runs import LEVELS, RunError
from emb.io import atomic_path

FIGURES = ("oa", "miou", "f1")


def add_blocks(acc: dict, weights: str, ids: list[str], per_sample: dict) -> None:
    """Add each sample's matrices to its block's in ``acc`` (numpy, on the host)."""
    host = {lv: cm.cpu().numpy() for lv, cm in per_sample.items()}
    for i, block in enumerate(ids):
        levels = acc.setdefault(block, {}).setdefault(weights, {})
        for lv, cm in host.items():
            levels[lv] = levels[lv] + cm[i] if lv in levels else cm[i].copy()


def merge_blocks(out: dict, mine: dict) -> None:
    """Every rank's blocks summed into ``out`` (a block may span the shards of two ranks)."""
    parts = [mine]
    if dist.is_available() and dist.is_initialized():
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
    for part in parts:
        for block, sets in part.items():
            for weights, levels in sets.items():
                into = out.setdefault(block, {}).setdefault(weights, {})
                for lv, cm in levels.items():
                    into[lv] = into[lv] + cm if lv in into else cm.copy()


def block_stacks(blocks: dict) -> tuple[list[str], dict[str, dict[str, np.ndarray]]]:
    """(sorted block ids, {weights: {level: (B, n, n) int64}}) of a per-block dict."""
    ids = sorted(blocks)
    first = blocks[ids[0]]
    return ids, {
        w: {lv: np.stack([blocks[b][w][lv] for b in ids]) for lv in first[w]} for w in first
    }


def interval_record(stacks: dict, selected: str, settings: BootstrapSettings) -> dict:
    """metrics.json ``intervals``: {weights: {level: {oa_lo, oa_hi, miou_lo, ...}}}, the
    selected weights' bounds also flat (``miou_l3_lo``) next to the figures."""
    out: dict = {"per_weights": {}}
    for w, levels in stacks.items():
        out["per_weights"][w] = {}
        for lv, cms in levels.items():
            iv = block_intervals(cms, settings)
            out["per_weights"][w][lv] = {
                k: (v.tolist() if isinstance(v, np.ndarray) and v.ndim else float(v))
                for k, v in iv.items()
                if k not in ("blocks", "reliable")
            }
    for lv in LEVELS:
        for fig in FIGURES:
            for end in ("lo", "hi"):
                out[f"{fig}_{lv}_{end}"] = out["per_weights"][selected][lv][f"{fig}_{end}"]
    return out


def write_blocks(path: Path, ids: list[str], stacks: dict) -> None:
    """``blocks.npz``: ``block_ids`` (B,) str and ``{weights}_{level}`` (B, n, n) int64, the
    per-block confusion matrices the summary pairs runs by."""
    arrays = {f"{w}_{lv}": cms for w, levels in stacks.items() for lv, cms in levels.items()}
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(fh, block_ids=np.array(ids, dtype=str), **arrays)


def read_blocks(path: Path, weights: str, level: str) -> dict[str, np.ndarray]:
    """{block id: (n, n)} of one weight set and level from a ``blocks.npz``."""
    with np.load(path) as z:
        key = f"{weights}_{level}"
        if key not in z:
            raise RunError(f"{path}: no {key!r} array (has {sorted(z.files)})")
        return dict(zip(z["block_ids"].tolist(), z[key], strict=True))

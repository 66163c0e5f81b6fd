"""Per-block confusion matrices: gathered over ranks, stacked, written, read, and turned into
the intervals of metrics.json (the block bootstrap of :mod:`emb.evaluation.bootstrap`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from emb.evaluation.bootstrap import BootstrapSettings, block_intervals, support_record
from emb.evaluation.runs import LEVELS, RunError
from emb.io import atomic_path
from emb.metrics import NUM_CLASSES, grouped_confusions

FIGURES = ("oa", "miou", "f1")


class BlockCounts:
    """Per-block confusion counts of one rank, kept on the device: one scatter-add per batch,
    weight set and level, read once at the end (a read per batch would stall a GPU)."""

    def __init__(self, block_ids: list[str], weights: list[str], device: torch.device) -> None:
        self.ids = sorted(set(block_ids))
        self.index = {block: i for i, block in enumerate(self.ids)}
        self.device = device
        self.counts = {
            w: {lv: torch.zeros(len(self.ids), n, n, dtype=torch.int64, device=device)
                for lv, n in NUM_CLASSES.items()}
            for w in weights
        }  # fmt: skip

    def add(self, weights: str, blocks: list[str], logits: dict, targets: dict) -> None:
        """Add a batch whose samples lie in ``blocks`` (host ids, one per sample)."""
        rows = torch.tensor([self.index[b] for b in blocks]).to(self.device, non_blocking=True)
        for lv, n in NUM_CLASSES.items():
            self.counts[weights][lv] += grouped_confusions(
                logits[lv].argmax(1), targets[lv], n, rows, len(self.ids)
            )

    def as_dict(self) -> dict:
        """{block: {weights: {level: (n, n) int64 numpy}}}, as :func:`merge_blocks` takes."""
        out: dict = {block: {} for block in self.ids}
        for w, levels in self.counts.items():
            for lv, stacked in levels.items():
                cms = stacked.cpu().numpy()
                for i, block in enumerate(self.ids):
                    out[block].setdefault(w, {})[lv] = cms[i]
        return out


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


def _plain(value: object) -> float | list | None:
    """A bound as a plain float, a list of them, or None where there is no interval (NaN,
    a class absent from every resample, stays NaN here: ``emb.io.write_json`` writes null)."""
    if isinstance(value, np.ndarray) and value.ndim:
        value = value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return None if value is None else float(value)


def interval_record(stacks: dict, selected: str, settings: BootstrapSettings) -> dict:
    """metrics.json ``intervals``: {weights: {level: {oa_lo, oa_hi, miou_lo, ...}}}, the
    selected weights' bounds also flat (``miou_l3_lo``) next to the figures, and ``bootstrap``
    (:func:`emb.evaluation.bootstrap.support_record`: the blocks, whether they are enough for
    an interval, and why not). Bounds are None where there is no interval."""
    out: dict = {"per_weights": {}}
    n_blocks = 0
    for w, levels in stacks.items():
        out["per_weights"][w] = {}
        for lv, cms in levels.items():
            iv = block_intervals(cms, settings)
            n_blocks = iv["blocks"]
            out["per_weights"][w][lv] = {
                k: _plain(v) for k, v in iv.items() if k not in ("blocks", "reliable")
            }
    for lv in LEVELS:
        for fig in FIGURES:
            for end in ("lo", "hi"):
                out[f"{fig}_{lv}_{end}"] = out["per_weights"][selected][lv][f"{fig}_{end}"]
    out["bootstrap"] = support_record(n_blocks, settings)
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

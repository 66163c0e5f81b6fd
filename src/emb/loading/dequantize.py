"""Compact batches -> model inputs, on the device: augmentation, de-quantization, normalization.

:class:`Dequantize` is the one place where a compact batch (int8 embeddings, uint8 labels,
float32 TESSERA scales) becomes ``x`` (B, D, T, T) float32 and ``y`` (B, T, T) int64; running it
on the device keeps host-to-device copies in the compact dtypes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from emb.rasters import AEF_NODATA


class StatsError(ValueError):
    """Channel statistics that cannot be computed from the shards (:mod:`emb.prep.channel_stats`)
    or cannot normalize inputs (a pickled, non-finite or non-positive value)."""


def load_channel_stat(path: Path, positive: bool = False) -> np.ndarray:
    """One float per channel, refused when pickled (code on load), non-finite or, for a std,
    not positive: a zero std divides by zero and shows up much later as a diverged step."""
    try:
        values = np.load(path, allow_pickle=False)
    except ValueError as err:  # object arrays need pickle: never load them
        raise StatsError(f"{path}: expected a plain numeric .npy, found {err}") from err
    if values.ndim != 1 or values.dtype.kind not in "fiu":
        raise StatsError(
            f"{path}: expected a 1-D numeric array, found {values.dtype} {values.shape}"
        )
    for channel, value in enumerate(values.astype(np.float64)):
        if not math.isfinite(value) or (positive and value <= 0):
            want = "a positive finite std" if positive else "a finite mean"
            raise StatsError(f"{path}: channel {channel}: expected {want}, found {value}")
    return values


AUG_CODES = 8  # code = k + 4 * flip: rot90 by k quarter turns after an optional W flip


def augment_batch(batch: dict, codes: torch.Tensor) -> dict:
    """Each sample's flip/rot90 ``codes[i]`` applied to every (B, ..., T, T) tensor of ``batch``.

    Run on the device by :class:`Dequantize`: a transposing copy in a reader thread would
    cost more than reading the tile, while on an accelerator it is cheap. ``codes`` stay on
    the host (they choose which kernels to queue; reading them from a GPU would stall it).
    """
    out = dict(batch)
    present = codes.numpy()  # a host tensor (numpy() refuses a device one)
    for name, t in batch.items():
        if name == "aug" or not isinstance(t, torch.Tensor) or t.dim() < 3:
            continue
        moved = t.clone()
        for code in sorted(set(present.tolist())):
            if code == 0:
                continue
            rows = torch.from_numpy(np.flatnonzero(present == code))
            idx = rows.to(t.device, non_blocking=True)
            part = t.index_select(0, idx)
            part = part.flip(-1) if code >= 4 else part
            moved.index_copy_(0, idx, part.rot90(code % 4, (-2, -1)))
        out[name] = moved
    return out


class Dequantize(nn.Module):
    """Compact batch -> (x (B, D, T, T) float32, y (B, T, T) int64), on the batch's device.

    A training batch's ``"aug"`` codes are applied first (:func:`augment_batch`).
    AEF: ``sign(q) * (q / 127.5) ** 2``. TESSERA: ``q * scale``, then ``(x - mean) / std``
    when statistics are given. Nodata pixels (AEF -128, TESSERA scale 0) become 0.
    """

    def __init__(self, source: str, mean: np.ndarray | None = None, std: np.ndarray | None = None):
        super().__init__()
        self.source = source
        self.normalize = mean is not None
        if mean is not None:
            self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32)[:, None, None])
            self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32)[:, None, None])

    @classmethod
    def from_stats(cls, source: str, stats_dir: Path | None) -> Dequantize:
        if stats_dir is None:
            return cls(source)
        mean = load_channel_stat(stats_dir / "channel_mean.npy")
        std = load_channel_stat(stats_dir / "channel_std.npy", positive=True)
        if mean.shape != std.shape:
            raise StatsError(
                f"{stats_dir}: channel_mean.npy has {mean.shape[0]} channels, "
                f"channel_std.npy {std.shape[0]}: expected the same count"
            )
        return cls(source, mean, std)

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if "aug" in batch:
            batch = augment_batch(batch, batch["aug"])
        q = batch["emb"]
        if self.source == "aef":
            x = q.float() / 127.5
            x = torch.sign(x) * x * x
            valid = (q[:, 0] != AEF_NODATA)[:, None]
        else:
            scale = batch["scale"].float()
            scale = scale[:, None] if scale.dim() == 3 else scale
            x = q.float() * scale
            valid = (scale > 0).any(1, keepdim=True) if scale.shape[1] > 1 else scale > 0
        if self.normalize:
            x = (x - self.mean) / self.std
        x = torch.where(valid, x, torch.zeros((), device=x.device))
        return x, batch["label"].long()

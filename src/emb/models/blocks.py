"""Pieces shared by both architectures: channels-first LayerNorm, drop path, the three heads.

Tensors are (B, C, H, W) unless a docstring says otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LEVELS = ("l1", "l2", "l3")


class LayerNorm2d(nn.Module):
    """LayerNorm over the channel axis of a (B, C, H, W) tensor, with a learned affine.

    Each pixel's C-vector is normalised on its own, so the result does not depend on batch
    size or tile size (unlike BatchNorm) and is invariant to scaling that vector by c > 0.
    """

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)  # (B, H, W, C): F.layer_norm normalises the last axis
        x = F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class DropPath(nn.Module):
    """Stochastic depth: in training, zero a residual branch for a random subset of samples.

    Survivors are scaled by 1 / (1 - p) so the expected output is unchanged; identity in eval.
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


def drop_path_rates(depths: tuple[int, ...], max_rate: float) -> list[list[float]]:
    """Per-block drop-path rates rising linearly from 0 to ``max_rate`` over all blocks."""
    total = sum(depths)
    rates = [max_rate * i / max(total - 1, 1) for i in range(total)]
    out, start = [], 0
    for d in depths:
        out.append(rates[start : start + d])
        start += d
    return out


class Heads(nn.Module):
    """Three independent 1x1 classifiers (L1, L2, L3) on a shared feature map.

    (B, dim, h, w) -> {"l1": (B, n1, H, W), "l2": ..., "l3": ...}, bilinearly upsampled to the
    input size (H, W). Upsampling the logits (not the features) keeps the heads cheap.
    """

    def __init__(self, dim: int, num_classes: tuple[int, int, int]) -> None:
        super().__init__()
        self.heads = nn.ModuleDict(
            {
                name: nn.Conv2d(dim, n, kernel_size=1)
                for name, n in zip(LEVELS, num_classes, strict=True)
            }
        )

    def forward(self, x: torch.Tensor, size: tuple[int, int]) -> dict[str, torch.Tensor]:
        return {
            name: F.interpolate(head(x), size=size, mode="bilinear", align_corners=False)
            for name, head in self.heads.items()
        }


def conv_macs(module: nn.Module, x: torch.Tensor) -> int:
    """Multiply-accumulates of every ``nn.Conv2d`` in ``module`` for one forward pass on ``x``.

    Per conv: output elements * (in_channels / groups) * kernel area. Norms, activations and
    bias adds are ignored (they are O(C) per pixel, not O(C^2)).
    """
    total = 0

    def hook(conv: nn.Conv2d, _inp: tuple[torch.Tensor], out: torch.Tensor) -> None:
        nonlocal total
        kh, kw = conv.kernel_size
        total += out.numel() * (conv.in_channels // conv.groups) * kh * kw

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, nn.Conv2d)]
    try:
        with torch.no_grad():
            module(x)
    finally:
        for h in handles:
            h.remove()
    return total

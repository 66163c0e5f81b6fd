"""SegFormer-style all-MLP decoder on a ConvNeXt encoder, with a cheap stem for embeddings.

Shapes for an input (B, in_dim, H, W) and widths (w1, ..., wn): stage i runs at stride
4 * 2**(i-1) with w_i channels; the decoder fuses all stages at stride 4 and the heads are
upsampled back to (H, W). H and W must be divisible by 4 * 2**(n-1) (32 for four stages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from emb.models.blocks import DropPath, Heads, LayerNorm2d, drop_path_rates

if TYPE_CHECKING:
    from emb.models.model_config import ModelConfig


class PatchifyStem(nn.Module):
    """(B, in_dim, H, W) -> (B, w0, H/4, W/4): 1x1 reduction, then a 4x4/4 patchify + LayerNorm.

    Why this and not a 7x7 conv: the input is already a per-pixel embedding (64/128 learned
    features), not raw radiance, so there is little to gain from a wide kernel on it and much
    to pay (a 7x7/2 conv 128->64 is 100k MACs per input pixel). The 1x1 is the only layer that
    sees in_dim channels; the patchify then works on w0 channels and, being non-overlapping,
    touches every pixel exactly once: in_dim*w0 + w0*w0 MACs per input pixel (12k for
    128->64). One 4x4/4 conv rather than two 2x2/2 convs keeps it to a single layer, as in
    ConvNeXt's own patchify stem; the 1x1 factorisation also halves its parameters
    (in*w0 + 16*w0^2 instead of 16*in*w0) and gives 64- and 128-channel inputs the same body.
    """

    def __init__(self, in_dim: int, width: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(in_dim, width, kernel_size=1, bias=False)
        self.patchify = nn.Conv2d(width, width, kernel_size=4, stride=4)
        self.norm = LayerNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.patchify(self.reduce(x)))


class ConvNeXtBlock(nn.Module):
    """7x7 depthwise conv -> LayerNorm -> 4x MLP (GELU) -> layer scale -> drop path + residual.

    Shape-preserving: (B, C, H, W) -> (B, C, H, W). The MLP runs channels-last as nn.Linear.
    Layer scale starts at 1e-6 so every block begins close to the identity.
    """

    def __init__(self, dim: int, drop_path: float = 0.0, layer_scale: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # (B, H, W, C)
        y = self.fc2(self.act(self.fc1(self.norm(y))))
        y = (self.gamma * y).permute(0, 3, 1, 2)
        return x + self.drop_path(y)


class ConvNeXtEncoder(nn.Module):
    """Stem + stages; between stages LayerNorm + 2x2/2 conv. Returns one map per stage.

    (B, in_dim, H, W) -> [(B, w_i, H / (4 * 2**i), W / (4 * 2**i)) for i in range(n)].
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.stem = PatchifyStem(cfg.in_dim, cfg.widths[0])
        rates = drop_path_rates(cfg.depths, cfg.drop_path)
        self.downsamples = nn.ModuleList([nn.Identity()])
        for c_in, c_out in zip(cfg.widths[:-1], cfg.widths[1:], strict=True):
            down = nn.Sequential(LayerNorm2d(c_in), nn.Conv2d(c_in, c_out, 2, stride=2))
            self.downsamples.append(down)
        self.stages = nn.ModuleList(
            nn.Sequential(*(ConvNeXtBlock(w, p) for p in stage_rates))
            for w, stage_rates in zip(cfg.widths, rates, strict=True)
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        feats = []
        for down, stage in zip(self.downsamples, self.stages, strict=True):
            x = stage(down(x))
            feats.append(x)
        return feats


class MLPDecoder(nn.Module):
    """SegFormer's all-MLP decoder.

    Each stage map -> 1x1 to decoder_dim -> bilinear to the stride-4 size; concat
    (n * decoder_dim channels) -> 1x1 fuse -> LayerNorm -> GELU -> (B, decoder_dim, H/4, W/4).
    LayerNorm instead of SegFormer's BatchNorm keeps the model free of batch statistics.
    """

    def __init__(self, widths: tuple[int, ...], dim: int) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Conv2d(w, dim, kernel_size=1) for w in widths)
        self.fuse = nn.Sequential(
            nn.Conv2d(len(widths) * dim, dim, kernel_size=1, bias=False),
            LayerNorm2d(dim),
            nn.GELU(),
        )

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        size = feats[0].shape[-2:]
        ups = [
            F.interpolate(p(f), size=size, mode="bilinear", align_corners=False) if i else p(f)
            for i, (p, f) in enumerate(zip(self.proj, feats, strict=True))
        ]
        return self.fuse(torch.cat(ups, dim=1))


class SegFormer(nn.Module):
    """(B, in_dim, H, W) -> {"l1": (B, 2, H, W), "l2": (B, 7, H, W), "l3": (B, 61, H, W)}."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_norm = LayerNorm2d(cfg.in_dim) if cfg.input_norm else nn.Identity()
        self.encoder = ConvNeXtEncoder(cfg)
        self.decoder = MLPDecoder(cfg.widths, cfg.decoder_dim)
        self.heads = Heads(cfg.decoder_dim, cfg.num_classes)
        self.apply(_init_weights)

    @property
    def stem(self) -> PatchifyStem:
        """The layers that touch the raw input (after the optional input norm)."""
        return self.encoder.stem

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        feats = self.encoder(self.input_norm(x))
        return self.heads(self.decoder(feats), size=x.shape[-2:])


def _init_weights(m: nn.Module) -> None:
    """ConvNeXt init: truncated normal (std 0.02) weights, zero biases; norms keep 1 / 0."""
    if isinstance(m, (nn.Conv2d, nn.Linear)):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)

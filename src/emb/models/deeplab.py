"""DeepLab v3+ (ASPP + low-level decoder) on a small ResNet of BasicBlocks, output stride 16.

Shapes for an input (B, in_dim, H, W) and widths (w1, ..., wn): the stem brings it to stride 4,
stage 1 stays there (w1 channels, the decoder's low-level features), each later stage halves
the resolution until stride 16; stages past that dilate instead (dilation 2, 4, ...), so the
ASPP sees (B, wn, H/16, W/16). H and W must be divisible by 16.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from emb.models.blocks import DropPath, Heads, LayerNorm2d, drop_path_rates
from emb.models.model_config import OUTPUT_STRIDE

if TYPE_CHECKING:
    from emb.models.model_config import ModelConfig

LOW_LEVEL_DIM = 48


def conv_bn_relu(
    c_in: int, c_out: int, k: int, stride: int = 1, dilation: int = 1
) -> nn.Sequential:
    """k x k conv ("same" padding for odd k) -> BatchNorm -> ReLU."""
    pad = dilation * (k - 1) // 2
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, k, stride=stride, padding=pad, dilation=dilation, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class ResidualStem(nn.Module):
    """(B, in_dim, H, W) -> (B, w0, H/4, W/4): 1x1 reduction, then two 3x3/2 convs.

    ResNet's 7x7/2 conv + max-pool would cost 128*64*49/4 = 100k MACs per input pixel on a
    128-channel embedding. Here only a 1x1 sees in_dim channels (in_dim*w0 MACs per pixel); the
    3x3/2 convs run on w0 channels at strides 2 and 4 (9*w0^2/4 + 9*w0^2/16), ~20k in total
    for 128->64. Two strided 3x3 convs instead of a max-pool keep the downsampling learned.
    """

    def __init__(self, in_dim: int, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            conv_bn_relu(in_dim, width, 1),
            conv_bn_relu(width, width, 3, stride=2),
            conv_bn_relu(width, width, 3, stride=2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class BasicBlock(nn.Module):
    """ResNet BasicBlock: two 3x3 conv-BN, ReLU between, residual (1x1 projection on change).

    (B, c_in, H, W) -> (B, c_out, H / stride, W / stride). The last BN starts at zero so each
    block begins as the identity (zero-init residual, Goyal et al. 2017).
    """

    def __init__(
        self, c_in: int, c_out: int, stride: int, dilation: int, drop_path: float = 0.0
    ) -> None:
        super().__init__()
        self.conv1 = conv_bn_relu(c_in, c_out, 3, stride=stride, dilation=dilation)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.conv1(x)))
        return F.relu(self.shortcut(x) + self.drop_path(y))


class ResNetEncoder(nn.Module):
    """Stem + stages of BasicBlocks. Returns (low-level stride-4 map, stride-16 map)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.stem = ResidualStem(cfg.in_dim, cfg.widths[0])
        rates = drop_path_rates(cfg.depths, cfg.drop_path)
        stages, stride, dilation, c_in = [], 4, 1, cfg.widths[0]
        for i, (width, stage_rates) in enumerate(zip(cfg.widths, rates, strict=True)):
            step = 1
            if i > 0 and stride < OUTPUT_STRIDE:
                step, stride = 2, stride * 2
            elif i > 0:
                dilation *= 2
            blocks = [
                BasicBlock(c_in if j == 0 else width, width, step if j == 0 else 1, dilation, p)
                for j, p in enumerate(stage_rates)
            ]
            stages.append(nn.Sequential(*blocks))
            c_in = width
        self.stages = nn.ModuleList(stages)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.stem(x)
        low = x = self.stages[0](x)
        for stage in self.stages[1:]:
            x = stage(x)
        return low, x


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling: (B, c_in, h, w) -> (B, dim, h, w).

    Branches: 1x1, one 3x3 per atrous rate, and image pooling (global mean -> 1x1 -> ReLU ->
    broadcast). The pooling branch has no BatchNorm: it holds one value per channel and
    sample, so BatchNorm would fail in training with batch size 1. Concat -> 1x1 -> BN -> ReLU.
    """

    def __init__(self, c_in: int, dim: int, rates: tuple[int, ...]) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            [conv_bn_relu(c_in, dim, 1)] + [conv_bn_relu(c_in, dim, 3, dilation=r) for r in rates]
        )
        self.pool = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(c_in, dim, 1), nn.ReLU(inplace=True)
        )
        self.project = conv_bn_relu((len(rates) + 2) * dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [b(x) for b in self.branches]
        outs.append(self.pool(x).expand(-1, -1, *x.shape[-2:]))
        return self.project(torch.cat(outs, dim=1))


class DeepLabV3Plus(nn.Module):
    """(B, in_dim, H, W) -> {"l1": (B, 2, H, W), "l2": (B, 7, H, W), "l3": (B, 61, H, W)}.

    Decoder: low-level stride-4 map -> 1x1 to 48 channels; concat with the ASPP output
    upsampled to stride 4; two 3x3 conv-BN-ReLU at decoder_dim; three 1x1 heads.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_norm = LayerNorm2d(cfg.in_dim) if cfg.input_norm else nn.Identity()
        self.encoder = ResNetEncoder(cfg)
        self.aspp = ASPP(cfg.widths[-1], cfg.decoder_dim, cfg.aspp_rates)
        self.low_level = conv_bn_relu(cfg.widths[0], LOW_LEVEL_DIM, 1)
        self.decoder = nn.Sequential(
            conv_bn_relu(cfg.decoder_dim + LOW_LEVEL_DIM, cfg.decoder_dim, 3),
            conv_bn_relu(cfg.decoder_dim, cfg.decoder_dim, 3),
        )
        self.heads = Heads(cfg.decoder_dim, cfg.num_classes)
        self._init_weights()

    @property
    def stem(self) -> ResidualStem:
        """The layers that touch the raw input (after the optional input norm)."""
        return self.encoder.stem

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        low, deep = self.encoder(self.input_norm(x))
        low = self.low_level(low)
        deep = F.interpolate(
            self.aspp(deep), size=low.shape[-2:], mode="bilinear", align_corners=False
        )
        return self.heads(self.decoder(torch.cat([deep, low], dim=1)), size=x.shape[-2:])

    def _init_weights(self) -> None:
        """Kaiming (fan_out, ReLU) convs, BN 1 / 0, zero last BN per block, small heads.

        Heads get std 0.01 so the initial logits are near zero (uniform class probabilities)
        instead of the O(1) spread kaiming would give a 61-way classifier.
        """
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)
        for head in self.heads.heads.values():
            nn.init.normal_(head.weight, std=0.01)

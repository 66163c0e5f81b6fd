"""Stem cost, parameter counts and CPU forward+backward time of the emb models.

Run: ``python bench/stem_cost.py`` (CPU; timings depend on the machine and its load).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from emb.models import ModelConfig, build_model, count_parameters
from emb.models.blocks import conv_macs

DEMO = {"widths": (16, 32, 64, 128), "depths": (1, 1, 2, 1), "decoder_dim": 64}


def fwd_bwd_seconds(cfg: ModelConfig, batch: int = 8, size: int = 64, reps: int = 5) -> float:
    """Median seconds of one forward + backward (sum of three CE losses) in train mode."""
    torch.manual_seed(0)
    model = build_model(cfg).train()
    x = torch.randn(batch, cfg.in_dim, size, size)
    ys = {
        k: torch.randint(0, n, (batch, size, size))
        for k, n in zip(("l1", "l2", "l3"), cfg.num_classes, strict=True)
    }
    times = []
    for _ in range(reps + 1):  # first run is warm-up
        t0 = time.perf_counter()
        out = model(x)
        sum(F.cross_entropy(out[k], y) for k, y in ys.items()).backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[reps // 2]


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    ref = 128 * 64 * 49
    print(f"7x7 conv 128->64 per input pixel: stride 2 {ref / 4:.0f}, stride 4 {ref / 16:.0f} MACs")
    for arch in ("segformer", "deeplab"):
        for in_dim in (64, 128):
            model = build_model(ModelConfig(arch=arch, in_dim=in_dim)).eval()
            macs = conv_macs(model.stem, torch.randn(1, in_dim, 64, 64)) / 64**2
            print(
                f"{arch:9s} in_dim={in_dim:3d} default: {count_parameters(model):>10,d} params, "
                f"stem {macs:.0f} MACs/input pixel"
            )
    for arch in ("segformer", "deeplab"):
        for in_dim in (64, 128):
            cfg = ModelConfig(arch=arch, in_dim=in_dim, **DEMO)
            params = count_parameters(build_model(cfg))
            secs = fwd_bwd_seconds(cfg)
            print(
                f"{arch:9s} in_dim={in_dim:3d} demo: {params:>9,d} params, "
                f"fwd+bwd 8x64x64 {secs * 1e3:.0f} ms"
            )


if __name__ == "__main__":
    main()

"""bench/gpu.py on the CPU with tiny models: every part runs and gives finite positive figures
(the GPU figures themselves come from GPU machines; docs/gpu.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from conftest import REPO, venv_env


def test_gpu_bench_tiny_cpu(tmp_path: Path) -> None:
    """Trainer and bare steps of the four runs, eager and channels_last; torch.compile is left
    out here (~80 s of compilation on 2 cores) and runs on GPUs."""
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, "bench/gpu.py", "--device", "cpu", "--tiny", "--no-compile",
           "--blocks", "1", "--steps", "1", "--json", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, env=venv_env(), check=True, timeout=600)
    rows = json.loads(out.read_text())["steps"]
    seen = {(r["run"], r["step"]) for r in rows}
    runs = ("aef_segformer", "aef_deeplab", "tessera_segformer", "tessera_deeplab")
    steps = ("bare/eager", "trainer/eager", "bare/cl", "trainer/cl")
    assert seen == {(run, step) for run in runs for step in steps}
    for r in rows:
        for key in ("ms", "samples_s", "tflops", "vs_bare_eager"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["run"], r["step"], key, r[key])


def test_gpu_bench_without_gpu_exits_0() -> None:
    """Asked for CUDA where there is none: says so and exits 0 (skipped where a GPU exists)."""
    import torch

    if torch.cuda.is_available():
        return
    done = subprocess.run([sys.executable, "bench/gpu.py"], cwd=REPO, env=venv_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "no GPU visible" in done.stdout

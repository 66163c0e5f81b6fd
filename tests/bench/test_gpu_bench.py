"""bench/gpu.py on the CPU with tiny models: every part runs and gives finite positive figures
(the GPU figures themselves come from GPU machines; docs/gpu.md)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, venv_env

sys.path.insert(0, str(REPO / "bench"))
import gpu_steps  # noqa: E402 - a bench script, imported from its folder

RUNS = ("aef_segformer", "aef_deeplab", "tessera_segformer", "tessera_deeplab")


def test_gpu_bench_tiny_cpu(tmp_path: Path) -> None:
    """All three parts in one run (~25 s on 2 cores): (a) trainer and bare steps of the four
    runs, eager and channels_last (torch.compile is left out here: ~80 s of compilation on 2
    cores; it runs on GPUs); (b) the training module through the launcher on synthetic shards,
    its samples/s and data wait parsed from its own log; (c) a predict job with (b)'s run."""
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, "bench/gpu.py", "--device", "cpu", "--tiny", "--no-compile",
           "--blocks", "1", "--steps", "1", "--json", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, env=venv_env(), check=True, timeout=600)
    result = json.loads(out.read_text())
    rows = result["steps"]
    seen = {(r["run"], r["step"]) for r in rows}
    runs = ("aef_segformer", "aef_deeplab", "tessera_segformer", "tessera_deeplab")
    steps = ("bare/eager", "trainer/eager", "bare/cl", "trainer/cl")
    assert seen == {(run, step) for run in runs for step in steps}
    for r in rows:
        for key in ("ms", "samples_s", "tflops", "vs_bare_eager"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["run"], r["step"], key, r[key])

    loop = {r["run"]: r for r in result["loop"]}
    assert set(loop) == {"aef_segformer", "tessera_deeplab"}  # both sources, both archs
    for run, r in loop.items():
        assert r["steps"] == 12 and [w["step"] for w in r["windows"]] == [4, 8, 12], (run, r)
        for key in ("samples_s", "warmup_samples_s", "of_bare", "job_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (run, key, r[key])
        for key in ("data_wait", "warmup_data_wait"):  # a share; 0.0% is a possible line
            assert 0 <= r[key] < 1, (run, key, r[key])
    assert all(v > 0 for v in result["loop_shards_write_s"].values())

    predict = result["predict"]
    assert predict["run"] == "aef_segformer" and predict["mpx"] == 128 * 128 / 1e6
    for key in ("job_mpx_s", "map_mpx_s"):
        assert math.isfinite(predict[key]) and predict[key] > 0, (key, predict[key])
    assert predict["map_mpx_s"] > predict["job_mpx_s"]  # the mapping alone skips start-up


@pytest.mark.parametrize("run", RUNS)
def test_part_a_puts_every_module_and_tensor_on_the_benchs_device(run: str) -> None:
    """Part (a)'s contenders, full size, built on the ``meta`` device (no memory, no compute):
    a module or tensor left on the CPU (as the class map was, which crashed part (a) on
    CUDA) is named. Built only: ``meta`` runs no kernels."""
    args = argparse.Namespace(tiny=False, no_compile=False, quick=False, runs=[run])
    meta = torch.device("meta")
    contenders, used, batch = gpu_steps.build_contenders(run, args, meta)
    assert {"bare/eager", "trainer/eager", "bare/cl", "trainer/cl", "trainer/compile"} <= set(
        contenders
    )
    assert sum(isinstance(m, torch.nn.Module) for things in used.values() for m in things) > 8
    assert gpu_steps.off_device(meta, used) == []
    assert gpu_steps.off_device(torch.device("cpu"), used)  # the check sees the devices


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the bench would use it")
def test_gpu_bench_without_gpu_exits_0() -> None:
    """Asked for CUDA where there is none: says so and exits 0."""
    done = subprocess.run([sys.executable, "bench/gpu.py"], cwd=REPO, env=venv_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "no GPU visible" in done.stdout

"""Maps and evaluation do not depend on how many processes make them: evaluation ranks sum
exact confusion matrices (torchrun, gloo on CPU), and concurrent prediction processes (a group
job's jobs) write the same maps as one process alone; each GPU process claims its own device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import rasterio
from conftest import CLASSES_CSV, TinyDemo, venv_env
from tiny_runs import tiny_run

from emb.evaluation.inference import claim_gpu
from emb.prep.demo_region import DEMO_REGIONS

REGIONS = [r.name for r in DEMO_REGIONS]


@pytest.fixture(scope="module")
def trained(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AEF DeepLab run (BatchNorm) with raw and EMA weights."""
    root = tmp_path_factory.mktemp("processes")
    return tiny_run(tiny_demo, root, "aef", "deeplab", steps=30, with_ema=True)


def evaluate_command(run_dir: Path, out: Path, nproc: int) -> list[str]:
    args = ["--run-dir", str(run_dir), "--classes", str(CLASSES_CSV), "--out-dir", str(out)]
    if nproc == 1:
        return [sys.executable, "-m", "emb.evaluation.evaluate", *args]
    return ["torchrun", "--standalone", f"--nproc_per_node={nproc}", "-m",
            "emb.evaluation.evaluate", *args]  # fmt: skip


def test_evaluation_with_two_ranks_writes_the_metrics_of_one(trained: Path, tmp_path) -> None:
    metrics = {}
    for nproc in (1, 2):
        out = tmp_path / f"eval{nproc}"
        done = subprocess.run(evaluate_command(trained, out, nproc), env=venv_env(),
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        metrics[nproc] = json.loads((out / "metrics.json").read_text())
    assert metrics[2]["samples"] > 0 and metrics[2]["weight_sets"] == ["raw", "ema"]
    assert metrics[2] == metrics[1]


def predict_command(run_dir: Path, raster: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "emb.evaluation.predict", "--run-dir", str(run_dir),
            "--raster", str(raster), "--region", out.stem, "--classes", str(CLASSES_CSV),
            "--out", str(out), "--png", str(out.with_suffix(".png")), "--threads", "1",
            "--probabilities", str(out.with_name(f"{out.stem}_prob.tif"))]  # fmt: skip


def read_all(path: Path) -> tuple[np.ndarray, dict]:
    with rasterio.open(path) as src:
        return src.read(), {"crs": src.crs, "transform": src.transform, "tags": src.tags()}


def test_concurrent_prediction_processes_write_the_maps_of_one_process(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    rasters = {region: tiny_demo.rasters[region]["aef"] for region in REGIONS}
    alone, together = tmp_path / "alone", tmp_path / "together"
    for region, raster in rasters.items():  # one process after the other
        cmd = predict_command(trained, raster, alone / f"{region}.tif")
        done = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    running = [  # both at once, as the jobs of one group job
        subprocess.Popen(predict_command(trained, raster, together / f"{region}.tif"),
                         env=venv_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for region, raster in rasters.items()
    ]  # fmt: skip
    for proc in running:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
    for region in REGIONS:
        for name in (f"{region}.tif", f"{region}_prob.tif"):
            a, meta_a = read_all(alone / name)
            b, meta_b = read_all(together / name)
            assert meta_a == meta_b, name
            assert np.array_equal(a, b), name
        assert (alone / f"{region}.tif").read_bytes() == (together / f"{region}.tif").read_bytes()


def test_each_process_claims_a_gpu_of_its_own_until_none_is_left(tmp_path: Path) -> None:
    assert [claim_gpu(3, tmp_path) for _ in range(4)] == [0, 1, 2, None]
    held = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from emb.evaluation.inference import claim_gpu; "
         f"print(claim_gpu(4, Path({str(tmp_path)!r})))"],
        env=venv_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert held.stdout.strip() == "3"  # another process sees the three claims of this one

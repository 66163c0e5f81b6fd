"""Maps and evaluation do not depend on how many processes make them: evaluation ranks sum
exact confusion matrices (torchrun, gloo on CPU), and a prediction job's ranks, each mapping its
share of the regions, write the maps of one process alone, byte for byte; a GPU process started
without torchrun claims a device of its own."""

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

from emb.models.runtime import claim_gpu
from emb.prep.demo_region import DEMO_REGIONS

REGIONS = [r.name for r in DEMO_REGIONS]


@pytest.fixture(scope="module")
def trained(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AEF DeepLab run (BatchNorm) with raw and EMA weights."""
    root = tmp_path_factory.mktemp("processes")
    return tiny_run(tiny_demo, root, "aef", "deeplab", steps=30, with_ema=True)


def evaluate_command(run_dir: Path, out: Path, nproc: int) -> list[str]:
    args = ["--run-dir", str(run_dir), "--classes", str(CLASSES_CSV), "--out-dir", str(out),
            "--threads=1"]  # fmt: skip
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


def regions_table(tiny_demo: TinyDemo, path: Path) -> Path:
    rows = ["region\tyear\taef\ttessera\tcdl\tsplit"]
    for region in REGIONS:
        files = tiny_demo.rasters[region]
        rows.append(f"{region}\t2024\t{files['aef']}\t\t{files['cdl']}\tauto")
    path.write_text("\n".join(rows) + "\n")
    return path


def predict_job(run_dir: Path, table: Path, out: Path, nproc: int) -> list[str]:
    """The predict rule's command: the launcher, ``nproc`` processes of 1 thread each."""
    return [sys.executable, "-m", "emb.cluster.launch", f"--nproc-per-node={nproc}",
            "--threads=1", "--", "emb.evaluation.predict", f"--run-dir={run_dir}",
            f"--regions={table}", f"--classes={CLASSES_CSV}", f"--out-dir={out}",
            "--threads=1", "--overlap=0.5", "--block=1024", "--batch-size=16",
            "--with-probabilities"]  # fmt: skip


def read_all(path: Path) -> tuple[np.ndarray, dict]:
    with rasterio.open(path) as src:
        return src.read(), {"crs": src.crs, "transform": src.transform, "tags": src.tags()}


def test_one_and_two_prediction_processes_write_the_same_maps_bit_for_bit(
    trained: Path, tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    table = regions_table(tiny_demo, tmp_path / "regions.tsv")
    outs = {n: tmp_path / f"maps{n}" / "aef_deeplab" for n in (1, 2)}
    logs = {}
    for nproc, out in outs.items():
        done = subprocess.run(predict_job(trained, table, out, nproc), env=venv_env(),
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        logs[nproc] = done.stdout + done.stderr
    assert "torchrun" in logs[2] and "rank 1 of 2: 1 of 2 regions" in logs[2]
    names = {p.name for p in outs[1].iterdir()}
    assert names == {f"{r}{ext}" for r in REGIONS for ext in
                     (".tif", ".tif.aux.xml", ".qml", ".png", "_probabilities.tif")}  # fmt: skip
    assert {p.name for p in outs[2].iterdir()} == names
    for name in sorted(names):
        assert (outs[1] / name).read_bytes() == (outs[2] / name).read_bytes(), name
    for region in REGIONS:  # and they are real maps on the input's grid
        data, meta = read_all(outs[2] / f"{region}.tif")
        with rasterio.open(tiny_demo.rasters[region]["aef"]) as src:
            assert (meta["crs"], meta["transform"]) == (src.crs, src.transform)
        assert meta["tags"]["REGION"] == region and (data != 255).any()
    assert not (tmp_path / "maps2" / ".partial").exists()  # staging removed once published


def test_each_process_claims_a_gpu_of_its_own_until_none_is_left(tmp_path: Path) -> None:
    assert [claim_gpu(3, tmp_path) for _ in range(4)] == [0, 1, 2, None]
    held = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from emb.models.runtime import claim_gpu; "
         f"print(claim_gpu(4, Path({str(tmp_path)!r})))"],
        env=venv_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert held.stdout.strip() == "3"  # another process sees the three claims of this one

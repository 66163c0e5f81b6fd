"""The recipe as the seeds teach it, second pass: per-architecture reference batch and the
divergent-LR warning, the seeds' log cadence with losses averaged over ranks, an honest EMA
decay, and stale settings."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from conftest import REPO, TINY, TinyDemo, venv_env
from training_runs import cpu_runtime, resolve_config, train_here, unstamped

from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec
from emb.training.ema import ModelEma
from emb.training.loop import build_trainer
from emb.training.lr_scaling import lr_warnings
from emb.training.run_config import TrainConfig, load
from emb.training.run_log import RunLog
from emb.training.schedule import build_plan
from emb.training.train_config import resolve
from emb.training.trainer import StepResult

SCHEMA = REPO / "workflow/schemas/train.schema.yaml"


def even_split(samples: int, shards: int) -> dict:
    """A manifest split of ``samples`` in ``shards`` equal shards (what a plan reads)."""
    return {"shards": [f"train-{i:04d}.tar" for i in range(shards)],
            "shard_samples": [samples // shards] * shards, "samples": samples}  # fmt: skip


def run_file(run: str, *overrides: str) -> TrainConfig:
    """A run's config as the workflow resolves it for your own data (no demo overlay)."""
    files = [REPO / "config/train/defaults.yaml", REPO / f"config/train/{run}.yaml"]
    return TrainConfig.from_dict(resolve(files, list(overrides), SCHEMA))


@pytest.mark.parametrize(
    ("run", "ranks", "lr"),
    [("aef_deeplab", 4, 4e-4), ("tessera_deeplab", 1, 1e-4), ("aef_segformer", 4, 1.2e-3)],
)
def test_linear_scaling_starts_from_the_batch_each_architecture_was_tuned_at(
    run: str, ranks: int, lr: float
) -> None:
    """Betzy: DeepLab 64 x 4 ranks is twice the seeds' 64 (4e-4, not the 8e-4 of a shared
    reference batch of 32); SegFormer 32 x 4 is four times its 32."""
    cfg = run_file(run, "train.lr_scaling=linear")
    assert build_plan(cfg, even_split(10_000, 8), ranks).lr == pytest.approx(lr)


def test_a_scaled_lr_where_the_seeds_saw_deeplab_diverge_is_warned_about() -> None:
    cfg = run_file("aef_deeplab", "train.lr_scaling=linear")
    assert lr_warnings(cfg, 4) == []  # 4e-4
    (line,) = lr_warnings(cfg, 8)  # 8e-4
    assert "scales optimizer.lr 0.0001 to 0.0008" in line and "diverge at 0.0005" in line
    assert "8 ranks x batch_size 64" in line
    assert lr_warnings(run_file("aef_segformer", "train.lr_scaling=linear"), 64) == []
    assert lr_warnings(run_file("aef_deeplab", "optimizer.lr=8.0e-4"), 8) == []  # set by hand


def test_the_workflow_warns_before_any_job(tmp_path: Path) -> None:
    """A dry run (no job runs) of the demo with DeepLab's LR scaled past 5e-4."""
    shutil.copytree(REPO / "config", tmp_path / "config")
    shutil.copytree(REPO / ".test", tmp_path / ".test")
    overlay = tmp_path / "scaled.yaml"
    overlay.write_text("train: {lr_scaling: linear, batch_size: 128}\n")
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--configfile",
           ".test/config.yaml", "-n", "--config", f"train_overlays=['{overlay}']"]  # fmt: skip
    result = subprocess.run(cmd, cwd=tmp_path, env=venv_env(), capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    for run in ("aef_deeplab", "tessera_deeplab"):
        assert re.search(rf"train config of run '{run}': deeplab: train.lr_scaling linear", out)
    assert "run 'aef_segformer'" not in out
    assert "rule train:" in out  # the jobs are listed, none ran


def test_ema_decay_warms_up_by_default_and_is_fixed_without_warmup() -> None:
    model = torch.nn.Linear(2, 2)
    warm, fixed = ModelEma(model, 0.9999, warmup=True), ModelEma(model, 0.9999, warmup=False)
    assert warm.current_decay() == pytest.approx(0.1) and fixed.current_decay() == 0.9999
    warm.updates = 80_000
    assert warm.current_decay() < 0.9999  # what the README states: reached after ~90k updates
    warm.updates = 90_000
    assert warm.current_decay() == 0.9999
    with torch.no_grad():
        model.weight.add_(1.0)
    before = fixed.module.weight.clone()
    fixed.update(model)
    expected = 0.9999 * before + 0.0001 * model.weight
    assert torch.allclose(fixed.module.weight, expected)


def test_ema_warmup_is_a_config_key_and_the_loop_honours_it(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    config = resolve_config(tiny_demo, tmp_path / "run", "ema.warmup=false")
    cfg = load(config)
    assert cfg.ema.warmup is False
    plan = build_plan(cfg, tiny_demo.manifest("aef")["splits"]["train"], 1)
    _, ema = build_trainer(cfg, plan, [1] * 61, 1, cpu_runtime(cfg))
    assert ema is not None and ema.current_decay() == cfg.ema.decay


def test_log_lines_follow_the_seeds_cadence(tiny_demo: TinyDemo, tmp_path: Path, capsys) -> None:
    """Every shipped run logs at the seeds' cadence (a brief line every 50 steps, a detailed
    one every 500) as the workflow resolves it; the lines themselves at a shorter one."""
    for run in ("aef_deeplab", "aef_segformer", "tessera_deeplab", "tessera_segformer"):
        logging = run_file(run).logging
        assert (logging.log_every, logging.detail_every) == (50, 500), run
    config = resolve_config(tiny_demo, tmp_path / "run", "train.max_updates=8",
                            "logging.log_every=2", "logging.detail_every=4")  # fmt: skip
    train_here(config)
    lines = [line for line in unstamped(capsys.readouterr().out)]
    steps = [line for line in lines if line.startswith("step ")]
    assert [int(line.split()[1]) for line in steps] == [2, 4, 6, 8]
    brief = re.compile(r"^step \d+ loss [\d.e+-]+ lr [\d.e+-]+ epoch \d+$")
    assert brief.match(steps[0]) and brief.match(steps[2]), steps
    for line in (steps[1], steps[3]):
        assert re.search(r"epoch \d+ \| l1 \S+ l2 \S+ l3 \S+ grad_norm \S+ samples/s \S+ "
                         r"pixels/s \S+ data_wait \S+%", line), line  # fmt: skip
    validations = [line for line in lines if line.startswith("validation ")]
    assert validations and all(re.search(r" \[\d+\.\ds\]$", v) for v in validations)
    with open(config.parent / "history.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert all(float(row["val_seconds"]) > 0 for row in rows)


def _two_ranks(rank: int, run_dir: str, config: str, samples: int, out: str) -> None:
    """One of two gloo ranks: a real trainer and run log, a step whose loss is the rank's own."""
    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg", rank=rank, world_size=2)
    sys.stdout = open(f"{out}{rank}", "w")  # noqa: SIM115 - the rank's console
    try:
        cfg = load(Path(config))
        trainer, _ = build_trainer(cfg, build_plan(cfg, even_split(samples, 2), 2), [1] * 61, 2,
                                   cpu_runtime(cfg))  # fmt: skip
        log = RunLog(Path(run_dir), rank, cfg)
        losses = {"l1": 1.0 + rank, "l2": 2.0 + rank, "l3": 3.0 + 3 * rank}
        for step, shift in ((1, -2.0), (2, 2.0)):  # the line averages the steps since the last
            trainer.step = step  # step 2 logs, on both ranks
            parts = {lv: torch.tensor(v + shift) for lv, v in losses.items()}
            result = StepResult(torch.tensor(True), torch.tensor(4.0 + 4 * rank + shift), parts,
                                torch.tensor(1.0), 4, 4096)  # fmt: skip
            log.step(result, trainer, 0.1, 0.0, 1)
        figures = {f"val_{m}_{lv}": 0.5 for m in ("miou", "f1", "oa") for lv in losses}
        log.validation({"val_loss": 1.0, **figures}, trainer, 1, 2.5)
        log.close()
    finally:
        sys.stdout.close()
        dist.destroy_process_group()


def test_train_losses_are_averaged_over_ranks(tiny_demo: TinyDemo, tmp_path: Path) -> None:
    """Rank 0 loses 4 and rank 1 loses 8: every train loss written is their mean, 6."""
    config = resolve_config(tiny_demo, tmp_path / "run", "logging.log_every=2")
    samples = tiny_demo.manifest("aef")["splits"]["train"]["samples"]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_two_ranks, (str(config.parent), str(config), samples, str(tmp_path / "out")),
             nprocs=2)  # fmt: skip
    console = (tmp_path / "out0").read_text()
    assert " step 2 loss 6 lr " in console, console
    assert "validation epoch 1 step 2 train_loss 6 " in console and console.endswith("[2.5s]\n")
    assert (tmp_path / "out1").read_text() == ""  # only rank 0 writes
    with open(config.parent / "history.csv") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["train_loss"]) == 6.0 and float(row["train_loss_l3"]) == 4.5
    assert float(row["val_seconds"]) == 2.5


def test_run_files_say_what_their_inputs_are() -> None:
    """TESSERA runs have no input LayerNorm because their channels are standardized; AEF runs
    do not normalize because their vectors are unit length."""
    for run in ("tessera_deeplab", "tessera_segformer"):
        text = (REPO / f"config/train/{run}.yaml").read_text()
        assert "AEF vectors are unit length" not in text, run
        assert run_file(run).data.normalize and not run_file(run).model.input_norm
    for run in ("aef_deeplab", "aef_segformer"):
        text = (REPO / f"config/train/{run}.yaml").read_text()
        assert "mean/std from results/stats" not in text, run
        config = run_file(run)
        assert (config.data.normalize, config.model.input_norm) == (False, True), run


def test_the_cuda_image_asks_for_the_slurm_plugin_the_package_does() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = next(d for d in deps if d.startswith("snakemake-executor-plugin-slurm"))
    assert f'"{wanted}"' in (REPO / "envs/emb-cuda.def").read_text()


def test_fewer_train_shards_than_ranks_fail_the_manifest_rule(
    tiny_demo: TinyDemo, tmp_path: Path
) -> None:
    """The manifest rule runs where Snakemake runs: the error comes before any GPU job."""
    indexes = []
    for region, files in tiny_demo.rasters.items():
        index = build_region("aef", region, files["aef"], tiny_demo.labels[("aef", region)],
                             tmp_path / region, TileSpec(TINY["tile"]), SplitSpec(TINY["block_m"]),
                             max_samples=TINY["max_samples"])  # fmt: skip
        indexes.append(tmp_path / f"{region}.json")
        indexes[-1].write_text(json.dumps(index))
    shards = len(tiny_demo.manifest("aef")["splits"]["train"]["shards"])

    def manifest(ranks: int) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "emb.prep.manifest", f"--out={tmp_path / 'manifest.json'}",
               f"--ranks={ranks}", "--workers=2", "--", *map(str, indexes)]  # fmt: skip
        return subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=120)

    assert manifest(shards).returncode == 0  # one shard per rank: enough
    (tmp_path / "manifest.json").unlink()
    result = manifest(shards + 1)
    assert result.returncode == 2, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert f"aef split 'train' has {shards} shards, expected at least {shards + 1}" in line
    assert f"{shards + 1} ranks x 2 reader threads" in line
    assert not (tmp_path / "manifest.json").exists()


def test_the_report_says_demo_figures_are_a_smoke_test() -> None:
    for caption in ("summary.rst", "summary_figure.rst"):
        text = " ".join((REPO / "workflow/report" / caption).read_text().split())
        assert "smoke test, not a benchmark" in text, caption


def demo_deeplab(tiny_demo: TinyDemo, run_dir: Path, *overrides: str) -> Path:
    """DeepLab as the demo trains it (run file + demo overlay, no test overlay), on the tiny
    demo's shards."""
    run_dir.mkdir(parents=True)
    files = [REPO / "config/train/defaults.yaml", REPO / "config/train/aef_deeplab.yaml",
             REPO / "config/train/demo.yaml"]  # fmt: skip
    sets = [f"data.manifest={tiny_demo.manifests['aef']}",
            f"data.classes={REPO / 'config/classes.csv'}", "logging.log_every=1",
            "train.val_every_updates=1000", *overrides]  # fmt: skip
    config = resolve(files, sets, SCHEMA)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run_dir / "config.yaml"


def test_deeplab_learns_in_the_demos_steps(tiny_demo: TinyDemo, tmp_path: Path, capsys) -> None:
    """At the recipe's 1e-4 the demo's DeepLab barely moved (test mIoU L3 0.14, one class at
    L1). Its train loss over the first 60 steps on the tiny demo: 4.77 -> 4.60 at 1e-4,
    4.75 -> 3.16 at the demo's 1e-3; it must fall by a fifth at least."""
    train_here(demo_deeplab(tiny_demo, tmp_path / "run", "train.max_updates=60"))
    losses = [float(line.split()[3]) for line in unstamped(capsys.readouterr().out)
              if line.startswith("step ")]  # fmt: skip
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, f"train loss {first:.3f} -> {last:.3f} in 60 steps"

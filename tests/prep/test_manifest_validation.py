"""The manifest rule refuses a validation split the training ranks cannot score (issue 51,
item 9): before, it was found when the training job started, after its queue wait for GPUs;
now the manifest (a local rule, before any training job is queued) says it in one line,
naming the run, and writes nothing. Evaluate declares the manifest it reads."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, TINY, TinyDemo, venv_env

from emb import stage_runner
from emb.loading.shard_manifest import ValidationTooSmall, check_validation_scored
from emb.prep.manifest import main as manifest_main
from emb.prep.shards import build_region
from emb.prep.spatial_split import SplitSpec
from emb.prep.tiles import TileSpec
from emb.workflow.stage_options import validation_options


@pytest.fixture(scope="module")
def indexes(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The AEF region indexes of the tiny demo, as the shards stage writes them."""
    root = tmp_path_factory.mktemp("indexes")
    paths = []
    for region, files in tiny_demo.rasters.items():
        out = root / region
        build_region("aef", region, files["aef"], tiny_demo.labels[("aef", region)], out,
                     TileSpec(TINY["tile"]), SplitSpec(TINY["block_m"]),
                     max_samples=TINY["max_samples"], index_path=out / "index.json")  # fmt: skip
        paths.append(out / "index.json")
    return paths


def test_a_val_split_no_rank_can_score_is_refused_naming_the_run(
    indexes: list[Path], tiny_demo: TinyDemo, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """As many ranks as val shards: each rank reads one shard, and a batch of one shard's
    samples is below the run's val_min_batch."""
    val = tiny_demo.manifest("aef")["splits"]["val"]
    ranks, biggest = len(val["shards"]), max(val["shard_samples"])
    out = tmp_path / "manifest.json"
    argv = [*map(str, indexes), f"--out={out}", f"--ranks={ranks}",
            f"--validation=run_a:{biggest + 4}:1", f"--validation=big_b:{biggest + 4}:"
            f"{biggest + 1}"]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        manifest_main(argv)
    assert exc.value.code == stage_runner.EXIT_INPUT
    err = capsys.readouterr().err
    errors = [s for s in err.splitlines() if " ERROR " in s]
    assert len(errors) == 1, err
    assert f"{out} (run 'big_b', {ranks} rank(s)): split 'val' holds {val['samples']}" in errors[0]
    assert f"train.val_min_batch {biggest + 1}" in errors[0]
    assert not out.exists()
    manifest_main([*argv[:-1], "--ranks=1"])  # one rank reads every val shard: it scores
    assert json.loads(out.read_text())["splits"]["val"]["samples"] == val["samples"]


def test_the_same_split_passes_on_fewer_ranks_as_training_decides() -> None:
    """One rule for the manifest and the training job (emb.loading.shard_manifest)."""
    val = {"shards": ["a.tar", "b.tar"], "shard_samples": [2, 2], "samples": 4}
    check_validation_scored(val, "m.json", 8, 4, 1)
    with pytest.raises(ValidationTooSmall, match=r"the busiest of 2 rank\(s\) reads 2"):
        check_validation_scored(val, "m.json", 8, 4, 2)


def test_the_rule_passes_each_run_of_the_source_with_its_batches() -> None:
    def run(source: str, batch: int, min_batch: int) -> dict:
        return {"data": {"source": source},
                "train": {"batch_size": batch, "val_min_batch": min_batch}}  # fmt: skip

    configs = {"aef_segformer": run("aef", 8, 2), "tessera_x": run("tessera", 4, 3),
               "aef_deeplab": run("aef", 16, 2)}  # fmt: skip
    assert validation_options(configs, "aef") == (
        "--validation=aef_segformer:8:2 --validation=aef_deeplab:16:2"
    )
    assert validation_options(configs, "tessera") == "--validation=tessera_x:4:3"


def test_snakemake_plans_the_check_and_evaluate_reads_the_manifest(tmp_path: Path) -> None:
    """The demo's dry run: rule manifest checks both AEF runs' batches on the profile's ranks,
    and rule evaluate lists the manifest among its inputs (a new manifest reruns it)."""
    shutil.copytree(REPO / "config", tmp_path / "config")
    (tmp_path / "launch.yaml").write_text(yaml.safe_dump({"launch": {"nproc_per_node": 2}}))
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n", "-p",
           "results/eval/aef_deeplab/metrics.json", "--configfile", "launch.yaml"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=venv_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-3000:]
    assert ("--ranks=2 --workers=0 --validation=aef_segformer:8:2 --validation=aef_deeplab:8:2"
            in printed), printed[-3000:]  # fmt: skip
    evaluate = printed[printed.index("rule evaluate:") :].splitlines()[1]
    assert evaluate.strip().startswith("input:") and "results/shards/aef/manifest.json" in evaluate

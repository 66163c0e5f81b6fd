"""1,000 prediction-only regions on a cluster profile: mapped by the one predict job per run,
never labelled, sharded or scored (no job beyond those of the training regions)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_profiles import cluster_env, dry_run, jobs_of
from test_scale_dry_run import PREP_PER_JOB, many_regions, submitted

TRAINING = 10


def predict_only(table: Path, training: int) -> Path:
    """The table with every row after the first ``training`` made prediction-only (no CDL)."""
    lines = table.read_text().splitlines()
    rows = [lines[0], *lines[1 : training + 1]]
    for line in lines[training + 1 :]:
        cells = line.split("\t")
        cells[4], cells[5] = "", "predict"
        rows.append("\t".join(cells))
    out = table.with_name("predict_only.tsv")
    out.write_text("\n".join(rows) + "\n")
    return out


@pytest.mark.parametrize("cluster", ["lumi"])  # betzy's job form is the same (its own test)
def test_a_thousand_prediction_only_regions_add_no_slurm_job(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, cluster: str
) -> None:
    table = predict_only(many_regions(tmp_path_factory.mktemp("inputs"), 1000), TRAINING)
    result = dry_run(tmp_path, Path(__file__).parents[2] / "profiles" / cluster,
                     cluster_env(tmp_path), "--config", f"regions={table}")  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    jobs = submitted(result.stdout)
    assert jobs.pop("group prep") == math.ceil(2 * TRAINING / PREP_PER_JOB)
    assert jobs == {"gpu_check": 1, "channel_stats": 2, "train": 4, "evaluate": 4, "predict": 4}
    predict = [job for job in jobs_of(result.stdout) if job["rule"] == "predict"]
    assert all("results/regions.tsv" in job["shell"] for job in predict)
    assert "region=r0999" not in result.stdout  # no per-region job: only predict reads it

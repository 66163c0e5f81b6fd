"""The profiles' checks: a real run refuses what cannot work, a dry run warns and goes on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from emb.workflow.profile import (
    ProfileError,
    check_runtime,
    container_image,
    group_size,
    is_dry_run,
    local_node,
    positive_number,
    predict_minutes,
    require_env,
)


@pytest.mark.parametrize(
    ("argv", "dry"),
    [(["-n", "--profile", "p"], True), (["--profile", "p", "-np"], True), (["--dry-run"], True),
     (["--dryrun"], True), (["--profile", "p"], False), (["--cores", "2", "-p"], False),
     (["--config", "--", "-n"], False)],
)  # fmt: skip
def test_dry_runs_are_recognized_from_snakemakes_command_line(argv, dry) -> None:
    assert is_dry_run(argv) is dry


def test_a_real_run_refuses_a_missing_variable_and_image(tmp_path) -> None:
    with pytest.raises(ProfileError, match="environment variable EMB_X is not set: set it"):
        require_env("EMB_X", "set it", env={}, argv=["--profile", "p"])
    with pytest.raises(ProfileError, match="no.sif .from EMB_C. does not exist"):
        container_image(str(tmp_path / "no.sif"), "EMB_C", argv=["--profile", "p"])


def test_a_dry_run_warns_and_uses_placeholders(tmp_path, capsys) -> None:
    assert require_env("EMB_X", "set it", env={}, argv=["-n"]) == "<EMB_X>"
    image = str(tmp_path / "no.sif")
    assert container_image(image, "EMB_C", argv=["-n"]) == image
    err = capsys.readouterr().err
    assert "warning: environment variable EMB_X is not set: set it (dry run" in err
    assert f"warning: container image {image} (from EMB_C) does not exist" in err
    assert require_env("EMB_X", "set it", env={"EMB_X": "v"}, argv=["-n"]) == "v"


@pytest.mark.parametrize("members", [0, -3, "50", 2.5, True, None])
def test_a_group_size_that_is_not_a_whole_number_of_jobs_is_refused(members) -> None:
    with pytest.raises(ProfileError, match=r"profile lumi: group-components prep: expected a "
                       r"whole number .* at least 1, found"):  # fmt: skip
        group_size(members, "prep", "lumi")
    assert group_size(50, "prep", "lumi") == 50


@pytest.mark.parametrize("value", [0, -3, "0", "fast", "nan", "inf", None, True, [200]])
def test_a_rate_or_time_limit_that_is_not_a_positive_number_is_refused_by_name(value) -> None:
    with pytest.raises(ProfileError, match=r"rule predict: mpx_per_minute: expected a number > 0"):
        positive_number(value, "mpx_per_minute", "predict")


def test_rates_snakemake_hands_over_as_strings_are_numbers() -> None:
    assert positive_number("1e-06", "mpx_per_minute", "predict") == 1e-6
    assert positive_number(200, "mpx_per_minute", "predict") == 200.0


def test_the_prediction_runtime_grows_with_megapixels_and_shrinks_with_processes() -> None:
    assert predict_minutes(0, 200, 8) == 10  # starting up
    assert predict_minutes(16_000, 200, 8) == 2 * 10 + 10  # 16,000 Mpx: 10 min on 8 GCDs
    assert predict_minutes(16_000, 200, 1) == 2 * 80 + 10
    check_runtime(2880, 2880, "job", "work", "fix")  # at the limit: fine
    check_runtime(10**6, None, "job", "work", "fix")  # no limit known: fine
    with pytest.raises(ProfileError, match="job: work needs about 2881 min, more than the "
                       "partition's limit max_runtime=2880 min; fix"):  # fmt: skip
        check_runtime(2881, 2880, "job", "work", "fix")


def test_the_local_slurm_node_is_sized_as_start_sh_sizes_it(tmp_path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683520 kB\nMemFree:        1 kB\n")
    node = local_node({}, meminfo=str(meminfo))
    assert node == {"cores": os.cpu_count(), "mem_mb": int(24683520 / 1024 * 0.85)}
    given = {"SLURM_LOCAL_CPUS": "3", "SLURM_LOCAL_MEM_MB": "5000"}
    assert local_node(given, meminfo=str(meminfo)) == {"cores": 3, "mem_mb": 5000}


def test_start_sh_sizes_the_node_by_every_cpu_even_under_omp_num_threads_1() -> None:
    """start.sh's own CPUS line, run with OMP_NUM_THREADS=1 exported (as a runner or a test
    that sets it does), gives the cores local_node assumes: ``nproc`` alone would give 1."""
    script = Path(__file__).parents[2] / "scripts" / "slurm" / "start.sh"
    (line,) = [x for x in script.read_text().splitlines() if x.startswith("CPUS=")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_LOCAL_")}
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run(["bash", "-c", f'{line}\necho "$CPUS"'], env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    assert int(out) == local_node(env)["cores"] == os.cpu_count()

"""Cluster profiles on a machine without SLURM: dry runs list every job with its resources, and
bad settings (account, image, GPU count) stop Snakemake before anything is submitted."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, TinyDemo

from emb.workflow.profile import ProfileError, container_image, gpus_per_node, require_env

CLUSTERS = {  # profile -> what its training jobs must ask SLURM for
    "betzy": {"slurm_partition=accel", "gres=gpu:4", "tasks_per_node=4", "gpus_per_node=4",
              "mpi=srun", "slurm_extra=--signal=USR1@300"},
    "lumi": {"slurm_partition=standard-g", "tasks_per_node=8", "gpus_per_node=8", "mpi=srun",
             "slurm_extra=--gpus-per-node=8 --signal=USR1@300"},
}  # fmt: skip
CPU_PARTITION = {"betzy": "preproc", "lumi": "small"}
TRAINING_READERS = {"betzy": "--ranks=4 --workers=7", "lumi": "--ranks=8 --workers=6"}
SEED_MODEL = {"widths": [64, 128, 256, 512], "depths": [2, 2, 6, 2], "decoder_dim": 256}
SEED_BATCH = {  # cluster -> run -> (batch_size per GPU, accumulation)
    "betzy": {"aef_deeplab": (64, 1), "tessera_deeplab": (64, 1), "aef_segformer": (32, 1),
              "tessera_segformer": (32, 1)},
    "lumi": {run: (16, 2) for run in ("aef_deeplab", "tessera_deeplab", "aef_segformer",
                                      "tessera_segformer")},
}  # fmt: skip


def cluster_env(tmp_path: Path) -> dict[str, str]:
    """A login shell's settings, on a PATH that holds no SLURM (nor apptainer) command, whose
    workflow imports this checkout's src (not whichever checkout the venv's editable install
    names: a worktree's new module would be missing, or another checkout's code tested)."""
    image = tmp_path / "emb.sif"
    image.write_bytes(b"")
    tools = tmp_path / "bin"  # the shell tools Snakemake and its SLURM plugin call, nothing else
    tools.mkdir(exist_ok=True)
    for tool in ("which", "sh", "bash", "uname"):
        (tools / tool).unlink(missing_ok=True)
        (tools / tool).symlink_to(shutil.which(tool))
    env = {
        "PATH": f"{Path(sys.executable).parent}:{tools}",
        "HOME": str(tmp_path),
        "EMB_ACCOUNT": "project_465000123",
        "EMB_CONTAINER": str(image),
        "EMB_PYTHONPATH": "/projappl/project_465000123/emb-venv/lib/python3.12/site-packages",
        "SINGULARITY_BIND": "/pfs,/scratch,/projappl,/project,/flash,/appl",
        "PYTHONPATH": str(REPO / "src"),
    }
    assert shutil.which("sbatch", path=env["PATH"]) is None
    return env


def dry_run(
    workdir: Path, profile: Path, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess:
    shutil.copytree(REPO / "config", workdir / "config", dirs_exist_ok=True)
    # A dry run caps threads at --cores (1 by default); SLURM jobs are not capped like that.
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "-n",
           "--profile", str(profile), "--cores", "64", *extra]  # fmt: skip
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)


def real_run(
    workdir: Path, profile: Path, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess:
    """The same command without -n: it would submit (no sbatch here, so it must stop first)."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "config", workdir / "config", dirs_exist_ok=True)
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--profile",
           str(profile), "--cores", "64", *extra]  # fmt: skip
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)


def jobs_of(stdout: str) -> list[dict[str, str]]:
    """Each listed job: its rule, resources line and shell command."""
    jobs = []
    for block in re.split(r"\n(?=[ \t]*(?:local)?rule \w+:)", stdout):  # grouped: indented
        rule = re.match(r"\s*(?:local)?rule (\w+):", block)
        if rule:
            resources = re.search(r"^\s+resources: (.*)$", block, re.M)
            shell = re.search(r"^Shell command: (.*)$", block, re.M)
            jobs.append({"rule": rule.group(1), "resources": resources.group(1) if resources
                         else "", "shell": shell.group(1) if shell else ""})  # fmt: skip
    return jobs


@pytest.fixture(scope="module", params=sorted(CLUSTERS))
def listed(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, str]]]:
    """(cluster, the jobs ``snakemake -n --profile profiles/<cluster>`` lists)."""
    tmp = tmp_path_factory.mktemp(request.param)
    result = dry_run(tmp, REPO / "profiles" / request.param, cluster_env(tmp))
    assert result.returncode == 0, result.stderr[-3000:]
    return request.param, jobs_of(result.stdout)


def test_dry_run_without_slurm_lists_every_job_with_its_resources(listed) -> None:
    cluster, jobs = listed
    assert {"demo_region", "shards", "gpu_check", "train_config", "train"} <= {
        job["rule"] for job in jobs
    }
    for job in jobs:
        assert "slurm_account=project_465000123" in job["resources"], job
        assert "runtime=" in job["resources"] and "mem_mb=" in job["resources"], job
    shards = next(job for job in jobs if job["rule"] == "shards")
    assert f"slurm_partition={CPU_PARTITION[cluster]}" in shards["resources"]


def test_channel_stats_get_the_profiles_threads(listed) -> None:
    _, jobs = listed
    stats = [job for job in jobs if job["rule"] == "channel_stats"]
    assert stats and all("--threads=8" in job["shell"] for job in stats), stats


def test_training_and_its_gpu_check_ask_for_whole_gpu_nodes_through_the_launcher(listed) -> None:
    cluster, jobs = listed
    for job in jobs:
        if job["rule"] in ("train", "gpu_check"):
            found = set(job["resources"].split(", "))
            expected = {r for r in CLUSTERS[cluster] if "signal" not in r or job["rule"] == "train"}
            if job["rule"] == "gpu_check":
                expected = {r for r in expected if not r.startswith("slurm_extra")}
            assert expected <= found, job
            assert "--srun" in job["shell"], job


def test_profile_selects_its_cluster_training_overrides(listed) -> None:
    cluster, jobs = listed
    configs = [job for job in jobs if job["rule"] == "train_config"]
    assert configs and all(
        f"config/train/cluster/{cluster}.yaml > logs/" in job["shell"] for job in configs
    )


def test_the_shard_count_check_counts_the_profiles_ranks_and_reader_threads(listed) -> None:
    cluster, jobs = listed
    manifests = [job for job in jobs if job["rule"] == "manifest"]
    assert manifests and all(TRAINING_READERS[cluster] in job["shell"] for job in manifests)


def test_demo_data_gets_the_demo_overlay_under_the_cluster_one(listed) -> None:
    cluster, jobs = listed
    configs = [job for job in jobs if job["rule"] == "train_config"]
    assert configs and all(
        f"config/train/demo.yaml config/train/cluster/{cluster}.yaml > " in job["shell"]
        for job in configs
    )


@pytest.fixture(scope="module", params=sorted(CLUSTERS))
def own_data(
    request, tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, dict]]:
    """(cluster, {run: config}) for a regions table of the user's own rasters: each run's
    config as its train_config job, listed by a dry run of the profile, resolves it."""
    tmp = tmp_path_factory.mktemp(f"own_{request.param}")
    table = tmp / "regions.tsv"
    rows = ["region\tyear\taef\ttessera\tcdl\tsplit"]
    for name, files in tiny_demo.rasters.items():  # real rasters, not the generated demo
        rows.append(f"field_{name[-1]}\t2024\t{files['aef']}\t{files['tessera']}\t"
                    f"{files['cdl']}\t")  # fmt: skip
    table.write_text("\n".join(rows) + "\n")
    env = cluster_env(tmp)
    blocks = tmp / "blocks.yaml"  # blocks small enough for the tiny rasters' three splits
    blocks.write_text("splits:\n  block_m: 320\n")
    result = dry_run(tmp, REPO / "profiles" / request.param, env, "--configfile",
                     "config/config.yaml", str(blocks), "--config", f"regions={table}")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    configs = {}
    for job in jobs_of(result.stdout):
        if job["rule"] == "train_config":
            assert "demo.yaml" not in job["shell"], job
            (tmp / "logs" / "train_config").mkdir(parents=True, exist_ok=True)
            done = subprocess.run(["bash", "-c", job["shell"]], cwd=tmp, env=env, timeout=300)
            assert done.returncode == 0, job["shell"]
            run = re.search(r"--out=results/runs/(\w+)/config.yaml", job["shell"]).group(1)
            configs[run] = yaml.safe_load((tmp / f"results/runs/{run}/config.yaml").read_text())
    return request.param, configs


def test_cluster_runs_on_own_data_train_the_seeds_models_and_batches(own_data) -> None:
    cluster, configs = own_data
    assert set(configs) == set(SEED_BATCH[cluster])
    for run, config in configs.items():
        assert {k: config["model"][k] for k in SEED_MODEL} == SEED_MODEL, run
        train = config["train"]
        assert (train["batch_size"], train["accumulation"]) == SEED_BATCH[cluster][run], run


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_a_typo_in_the_cluster_overlay_stops_before_submission_naming_file_and_key(
    cluster: str, tmp_path: Path
) -> None:
    overlay = f"config/train/cluster/{cluster}-typo.yaml"
    text = (REPO / "config/train/cluster" / f"{cluster}.yaml").read_text()
    assert "  num_workers:" in text
    (tmp_path / "wd" / overlay).parent.mkdir(parents=True)
    (tmp_path / "wd" / overlay).write_text(text.replace("  num_workers:", "  num_workrs:"))
    profile = tmp_path / "profile"
    profile.mkdir()
    settings = (REPO / "profiles" / cluster / "config.v8+.yaml").read_text()
    edited = settings.replace(f"train_overlay: config/train/cluster/{cluster}.yaml",
                              f"train_overlay: {overlay}")  # fmt: skip
    assert edited != settings
    (profile / "config.v8+.yaml").write_text(edited)
    result = dry_run(tmp_path / "wd", profile, cluster_env(tmp_path))
    assert result.returncode != 0
    message = result.stderr + result.stdout
    assert f"{overlay}: unknown key train.num_workrs" in message
    assert "Traceback" not in message and "rule train" not in result.stdout


def test_only_lumi_training_gets_the_rocm_environment_and_never_the_rocm_flag(listed) -> None:
    cluster, jobs = listed
    shell = next(job for job in jobs if job["rule"] == "train")["shell"]
    rocm = ("NCCL_SOCKET_IFNAME=hsn", "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True",
            "WANDB_MODE=offline", "'MIOPEN_USER_DB_PATH=/tmp/")  # fmt: skip
    found = [setting for setting in rocm if f"--env {setting}" in shell]
    assert found == (list(rocm) if cluster == "lumi" else []), shell
    assert "NCCL_NET_GDR_LEVEL" not in shell  # it hangs multi-node jobs in ROCm 7 containers
    profile = (REPO / "profiles" / cluster / "config.v8+.yaml").read_text()
    assert "--rocm" not in profile.replace("Not --rocm", "")


@pytest.mark.parametrize(
    ("unset", "message"),
    [("EMB_ACCOUNT", "environment variable EMB_ACCOUNT is not set"),
     ("EMB_CONTAINER", "environment variable EMB_CONTAINER is not set")],
)  # fmt: skip
@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_missing_variable_stops_a_real_run_and_only_warns_in_a_dry_run(
    cluster: str, unset: str, message: str, tmp_path: Path
) -> None:
    env = cluster_env(tmp_path)
    del env[unset]
    real = real_run(tmp_path / "real", REPO / "profiles" / cluster, env)
    assert real.returncode != 0
    assert message in real.stderr + real.stdout
    assert "rule train" not in real.stdout and "Submitted" not in real.stdout + real.stderr
    dry = dry_run(tmp_path / "dry", REPO / "profiles" / cluster, env)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"warning: {message}" in dry.stderr
    assert "rule train" in dry.stdout  # every job is still listed, with its resources


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_missing_container_image_stops_a_real_run_only(cluster: str, tmp_path: Path) -> None:
    env = cluster_env(tmp_path)
    env["EMB_CONTAINER"] = str(tmp_path / "nowhere" / "emb.sif")
    message = f"container image {env['EMB_CONTAINER']} (from EMB_CONTAINER) does not exist"
    real = real_run(tmp_path / "real", REPO / "profiles" / cluster, env)
    assert real.returncode != 0 and message in real.stderr + real.stdout
    dry = dry_run(tmp_path / "dry", REPO / "profiles" / cluster, env)
    assert dry.returncode == 0 and f"warning: {message}" in dry.stderr


@pytest.mark.parametrize(("cluster", "gpus"), [("betzy", 8), ("lumi", 16)])
def test_profile_asking_more_gpus_than_a_node_has_stops_before_submission(
    cluster: str, gpus: int, tmp_path: Path
) -> None:
    profile = tmp_path / "profile"
    profile.mkdir()
    text = (REPO / "profiles" / cluster / "config.v8+.yaml").read_text()
    edited = re.sub(r"gpus_per_node\((\d+),", f"gpus_per_node({gpus},", text)
    assert edited != text
    (profile / "config.v8+.yaml").write_text(edited)
    result = dry_run(tmp_path / "wd", profile, cluster_env(tmp_path))
    assert result.returncode != 0
    assert f"asks for {gpus} GPUs per node, but {cluster} nodes have" in (
        result.stderr + result.stdout
    )


def test_profile_checks_name_the_variable_and_the_value() -> None:
    assert require_env("A", "hint", {"A": "x"}) == "x"
    with pytest.raises(ProfileError, match="environment variable A is not set: set it"):
        require_env("A", "set it", {"A": ""})
    assert gpus_per_node(4, "betzy", 4) == 4
    with pytest.raises(ProfileError, match="asks for 0 GPUs per node"):
        gpus_per_node(0, "betzy", 4)
    with pytest.raises(ProfileError, match="/no/such.sif"):
        container_image("/no/such.sif", "EMB_CONTAINER")


def test_no_profile_is_named_default() -> None:
    assert not (REPO / "profiles" / "default").exists()
    names = {p.parent.name for p in (REPO / "profiles").glob("*/config.v8+.yaml")}
    assert names == {"local", "betzy", "lumi", "slurm-localhost"}


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[]", r.strip(), maxsplit=1)[0].lower() for r in requirements}


def test_container_recipe_installs_what_the_package_needs() -> None:
    """(envs/emb.yaml, the conda environment: tests/test_envs.py.)"""
    block = re.search(r"^dependencies = \[(.*?)^\]", (REPO / "pyproject.toml").read_text(),
                      re.M | re.S)  # fmt: skip
    needed = requirement_names(re.findall(r'"([^"]+)"', block.group(1))) - {"torch"}
    recipe = (REPO / "envs" / "emb-cuda.def").read_text()
    quoted = re.findall(r'"([A-Za-z0-9_.-]+)[<>=!~]', recipe)
    assert needed <= requirement_names(quoted), needed - requirement_names(quoted)

"""The launcher: which command each form runs, and real signals through real torchrun."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, venv_env
from fake_gpus import fake_gpu_command

from emb.cluster.launch import (
    NPROC_ENV,
    Launch,
    c10d_port,
    command,
    environment,
    parse_args,
    prepare,
    split_endpoint,
)
from emb.cluster.retries import earlier_failure, record_failure
from emb.cluster.supervise import (
    EX_TEMPFAIL,
    LaunchError,
    descendants,
    process_parents,
    resumable_exit,
)
from emb.workflow.stage_options import rule_options

TRAIN = ["emb.training.train", ["--config", "results/runs/r/config.yaml"]]


def test_one_process_runs_the_module_without_torchrun() -> None:
    assert command(Launch(), *TRAIN, "", "local") == [
        "python", "-m", "emb.training.train", "--config", "results/runs/r/config.yaml"
    ]  # fmt: skip


def test_one_node_with_n_gpus_runs_torchrun_standalone() -> None:
    cmd = command(Launch(nproc_per_node=4), *TRAIN, "", "local")
    assert cmd[:5] == ["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=4",
                       "--max_restarts=0"]  # fmt: skip
    assert cmd[5:8] == ["-m", "emb.training.train", "--config"]


def test_several_nodes_run_one_srun_task_per_node_meeting_at_the_first_node() -> None:
    launch = Launch(nodes=2, nproc_per_node=8, threads=7, srun=True)
    cmd = command(launch, *TRAIN, "nid001:29442", "1234")
    assert cmd[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                       "--cpus-per-task=56", "--kill-on-bad-exit=1"]  # fmt: skip
    assert cmd[6:13] == ["python", "-m", "emb.cluster.launch", "--supervise", "--nodes=2",
                         "--rdzv-timeout=600", "--"]  # fmt: skip
    torchrun = cmd[13:]
    assert torchrun[0] == "torchrun"
    for arg in ("--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=nid001:29442",
                "--rdzv_id=1234", "--nproc_per_node=8",
                "--rdzv_conf=join_timeout=600,read_timeout=600"):  # fmt: skip
        assert arg in torchrun
    assert "--standalone" not in torchrun


def test_nodes_started_by_hand_meet_at_the_endpoint_given() -> None:
    """Without SLURM (``--endpoint``): the node command runs directly, the same torchrun an
    srun task runs; the rendezvous waits ``rdzv_timeout_s``; on one machine, where every
    node's host matches the endpoint, ``hosts_endpoint`` says which node hosts it."""
    launch = Launch(nodes=2, endpoint="127.0.0.1:29500", hosts_endpoint=False, rdzv_timeout_s=30)
    cmd = command(launch, *TRAIN, launch.endpoint, "job7")
    assert cmd[:6] == ["torchrun", "--nnodes=2", "--rdzv_backend=c10d",
                       "--rdzv_endpoint=127.0.0.1:29500", "--rdzv_id=job7",
                       "--rdzv_conf=join_timeout=30,read_timeout=30,is_host=0"]  # fmt: skip
    srun = command(Launch(nodes=2, srun=True), *TRAIN, "127.0.0.1:29500", "job7")
    at = srun.index("torchrun")
    assert srun[at : at + 5] == cmd[:5]  # an srun task runs the same torchrun


def test_srun_on_one_node_stays_standalone_unless_c10d_is_asked() -> None:
    one = command(Launch(nproc_per_node=2, srun=True), *TRAIN, "h:1", "9")
    assert "--standalone" in one and "--rdzv_backend=c10d" not in one
    forced = command(Launch(nproc_per_node=2, srun=True, rendezvous="c10d"), *TRAIN, "h:1", "9")
    assert "--rdzv_backend=c10d" in forced and "--nnodes=1" in forced


def test_container_runs_inside_each_srun_task_not_around_srun() -> None:
    launch = Launch(nproc_per_node=4, srun=True, container="/img/emb.sif",
                    container_args="--nv --bind /cluster")  # fmt: skip
    cmd = command(launch, *TRAIN, "", "1")
    assert cmd[0] == "srun"
    at = cmd.index("apptainer")
    assert cmd[at : at + 6] == ["apptainer", "exec", "--nv", "--bind", "/cluster", "/img/emb.sif"]
    assert cmd[at + 6:at + 9] == ["python", "-m", "emb.cluster.launch"]  # fmt: skip


def test_per_node_check_runs_one_plain_process_per_node() -> None:
    cmd = command(Launch(nodes=2, nproc_per_node=4, srun=True, per_node=True),
                  "emb.cluster.gpu_check", ["--gpus", "4"], "", "1")  # fmt: skip
    assert "torchrun" not in cmd
    assert cmd[-5:] == ["python", "-m", "emb.cluster.gpu_check", "--gpus", "4"]


def test_rule_options_follow_the_profile_resources() -> None:
    env = "NCCL_SOCKET_IFNAME=hsn MIOPEN_USER_DB_PATH=/tmp/$USER-m"
    resources = {"nodes": 2, "tasks_per_node": 8, "cpus_per_task": 7, "mpi": "srun",
                 "launch_env": env}  # fmt: skip
    options = rule_options(resources, "/img.sif", "--env PYTHONPATH=/v")
    assert options == (
        "--nodes 2 --nproc-per-node 8 --threads 7 --srun --container /img.sif"
        " --container-args '--env PYTHONPATH=/v' --env NCCL_SOCKET_IFNAME=hsn"
        " --env 'MIOPEN_USER_DB_PATH=/tmp/$USER-m'"
    )
    assert rule_options({"tasks_per_node": 1}) == "--nodes 1 --nproc-per-node 1 --threads 1"


def test_environment_defaults_expand_at_launch_and_never_override_the_user() -> None:
    launch = Launch(threads=3, env=("MIOPEN_USER_DB_PATH=/tmp/$USER-miopen-${SLURM_JOB_ID}",
                                    "WANDB_MODE=offline"))  # fmt: skip
    env = environment(launch, {"USER": "ada", "SLURM_JOB_ID": "77", "WANDB_MODE": "online"})
    assert env["MIOPEN_USER_DB_PATH"] == "/tmp/ada-miopen-77"
    assert env["WANDB_MODE"] == "online"
    assert env["OMP_NUM_THREADS"] == "3"
    with pytest.raises(LaunchError, match=r"\$SLURM_JOB_ID is not set"):
        environment(launch, {"USER": "ada"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 2}, r"2 nodes need srun \(a SLURM allocation\) or --endpoint HOST:PORT"),
        ({"nodes": 2, "endpoint": "nohost"}, "endpoint: expected HOST:PORT, found 'nohost'"),
        ({"nodes": 2, "endpoint": "h:65536"}, "endpoint h:65536: expected a port in 1-65535"),
        ({"nodes": 2, "endpoint": "h:1", "srun": True}, "found both"),
        ({"rdzv_timeout_s": 0}, "rdzv_timeout_s must be >= 1, found 0"),
        ({"nproc_per_node": 0}, "nproc_per_node must be >= 1, found 0"),
        ({"rendezvous": "etcd"}, "rendezvous must be one of"),
        ({"env": ("NOEQUALS",)}, "expected NAME=VALUE"),
    ],
)
def test_impossible_launches_are_refused_with_the_value_found(kwargs, message) -> None:
    with pytest.raises(LaunchError, match=message):
        Launch(**kwargs)


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [("h:1", ("h", 1)), ("h:65535", ("h", 65535)), ("[::1]:65535", ("::1", 65535))],
)
def test_the_endpoint_ports_at_the_ends_of_the_range_are_accepted(endpoint: str, expected) -> None:
    assert split_endpoint(endpoint) == expected
    assert Launch(nodes=2, endpoint=endpoint).endpoint == endpoint


@pytest.mark.parametrize(("endpoint", "port"), [("h:0", 0), ("h:65536", 65536), ("[::1]:0", 0)])
def test_the_endpoint_ports_just_outside_the_range_are_refused(endpoint: str, port: int) -> None:
    message = f"endpoint {re.escape(endpoint)}: expected a port in 1-65535, found {port}$"
    with pytest.raises(LaunchError, match=message):
        split_endpoint(endpoint)
    with pytest.raises(LaunchError, match=message):
        Launch(nodes=2, endpoint=endpoint)


def test_c10d_port_differs_between_jobs_sharing_a_node() -> None:
    assert c10d_port("1001") != c10d_port("1002")
    assert c10d_port(None) == c10d_port("local") == 29400


def test_descendants_walk_the_whole_tree_below_a_process() -> None:
    parents = {10: 1, 11: 10, 12: 10, 13: 11, 14: 13, 20: 1}
    assert sorted(descendants(parents, 10)) == [11, 12, 13, 14]
    me = os.getpid()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert child.pid in descendants(process_parents(), me)
    finally:
        child.kill()
        child.wait()


def test_resumable_exit_only_for_a_failure_that_wrote_a_fresh_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "last.pt"
    assert resumable_exit(1, ckpt, time.time()) == 1  # no checkpoint
    ckpt.write_text("x")
    assert resumable_exit(1, ckpt, time.time() - 60) == EX_TEMPFAIL
    assert resumable_exit(1, ckpt, time.time() + 60) == 1  # older than this launch
    assert resumable_exit(0, ckpt, time.time() - 60) == 0


def start_probe(tmp_path: Path, nproc: int) -> subprocess.Popen:
    env = venv_env()
    env["PYTHONPATH"] = f"{REPO / 'tests' / 'slurm'}:{env.get('PYTHONPATH', '')}"
    cmd = [sys.executable, "-m", "emb.cluster.launch", "--nproc-per-node", str(nproc),
           "--checkpoint", str(tmp_path / "last.pt"), "--", "stopprobe", str(tmp_path)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    deadline = time.time() + 90
    while not all((tmp_path / f"ready{r}").exists() for r in range(nproc)):
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.time() < deadline, "probe ranks never became ready"
        time.sleep(0.1)
    return proc


def test_usr1_to_the_launcher_reaches_every_torchrun_worker_and_exits_75(tmp_path: Path) -> None:
    proc = start_probe(tmp_path, nproc=2)
    proc.send_signal(signal.SIGUSR1)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == EX_TEMPFAIL, out[-3000:]
    assert {(tmp_path / f"stopped{r}").read_text() for r in (0, 1)} == {"SIGUSR1"}


def test_torchrun_survives_usr1_sent_to_every_process_as_slurm_does(tmp_path: Path) -> None:
    proc = start_probe(tmp_path, nproc=2)
    tree = [proc.pid, *descendants(process_parents(), proc.pid)]
    assert len(tree) >= 4  # launcher, torchrun, two workers
    for pid in tree:
        os.kill(pid, signal.SIGUSR1)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == EX_TEMPFAIL, out[-3000:]
    for rank in (0, 1):
        assert set((tmp_path / f"stopped{rank}").read_text().split()) == {"SIGUSR1"}


def launcher(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in venv_env().items() if not k.startswith("SLURM_")}
    cmd = [sys.executable, "-m", "emb.cluster.launch", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_cli_prints_the_command_it_would_run() -> None:
    result = launcher("--dry-run", "--nproc-per-node", "2", "--srun", "--rendezvous", "c10d",
                      "--", "emb.training.train", "--config", "c.yaml")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("launch: srun --nodes=1 --ntasks=1")
    assert "--rdzv_backend=c10d --rdzv_endpoint=" in result.stdout
    assert result.stdout.rstrip().endswith("-m emb.training.train --config c.yaml")


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--nodes", "2"], "error: 2 nodes need srun"),
     (["--srun", "--container", "/no/such.sif"], "error: container image /no/such.sif does not")],
)  # fmt: skip
def test_cli_refuses_a_launch_it_cannot_start_before_running_anything(args, message) -> None:
    result = launcher(*args, "--", "emb.training.train")
    assert result.returncode == 2
    assert message in result.stderr
    assert "launch:" not in result.stdout


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [("no-such-host.invalid:29517", r"error: endpoint no-such-host\.invalid:29517: host "
      r"'no-such-host\.invalid' does not resolve on this node \(.+\); expected the first "
      "node's host name or address"),  # the resolver's words: "Name or service not known"
     ("127.0.0.1:295000", r"error: endpoint 127\.0\.0\.1:295000: expected a port in 1-65535, "
      "found 295000"),
     ("127.0.0.1:0", r"error: endpoint 127\.0\.0\.1:0: expected a port in 1-65535, found 0")],
    ids=["host-not-resolving", "port-above-65535", "port-0"],
)  # fmt: skip
def test_an_endpoint_that_cannot_be_reached_is_refused_in_one_line_before_torchrun(
    endpoint: str, message: str
) -> None:
    """Before the check: 40 s of torchrun's resolver warnings and a line blaming a wait (a bad
    host), or a heartbeat thread dead with a TypeError (a bad port)."""
    result = launcher("--nodes", "2", "--endpoint", endpoint, "--", "emb.training.train")
    assert result.returncode == 2
    assert result.stdout == ""  # no "launch:" line: torchrun never started
    (line,) = result.stderr.splitlines()
    assert re.fullmatch(message, line), line


def launch_failing(tmp_path: Path, attempt: int, record: Path) -> subprocess.CompletedProcess:
    """The launcher running a module that fails with exit 2 (json.tool on a missing file)."""
    missing = str(tmp_path / "missing.json")
    cmd = [sys.executable, "-m", "emb.cluster.launch", "--attempt", str(attempt),
           "--failure-record", str(record), "--", "json.tool", missing]  # fmt: skip
    return subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=120)


def test_a_retry_of_a_failure_no_retry_can_fix_ends_at_once_with_its_exit_code(tmp_path) -> None:
    record = tmp_path / "run" / "launch.failed.json"
    first = launch_failing(tmp_path, 1, record)
    assert first.returncode == 2 and "launch:" in first.stdout  # it ran the command
    assert record.is_file()
    tick = time.monotonic()
    retry = launch_failing(tmp_path, 2, record)
    assert time.monotonic() - tick < 30
    assert retry.returncode == 2
    assert "launch:" not in retry.stdout  # nothing started
    assert "attempt 2: attempt 1 of this job failed with exit code 2" in retry.stderr
    again = launch_failing(tmp_path, 1, record)  # a new Snakemake run starts afresh
    assert again.returncode == 2 and "launch:" in again.stdout


def test_a_retry_repeats_why_the_first_attempt_failed(tmp_path: Path) -> None:
    """Snakemake drops a failed attempt's log before its retry: the retry says why itself."""
    record = tmp_path / "run" / "launch.failed.json"
    history = tmp_path / "no_history.csv"

    def attempt(n: int) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "emb.cluster.launch", f"--attempt={n}",
               f"--failure-record={record}", "--", "emb.report.curves", f"--history={history}",
               "--run=r", f"--out={tmp_path / 'c.png'}"]  # fmt: skip
        return subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=120)

    first = attempt(1)
    assert first.returncode != 0 and str(history) in first.stderr
    retry = attempt(2)
    assert retry.returncode == first.returncode
    assert "launch:" not in retry.stdout
    assert "attempt 1 of this job failed" in retry.stderr and str(history) in retry.stderr


def test_a_stop_with_a_checkpoint_or_a_success_leaves_no_failure_record(tmp_path: Path) -> None:
    record = tmp_path / "launch.failed.json"
    for code in (0, EX_TEMPFAIL):
        record_failure(record, 1, code)
        assert not record.exists()
        assert earlier_failure(record, 2) is None
    record_failure(record, 1, 3)
    assert earlier_failure(record, 2) == (3, earlier_failure(record, 2)[1])
    assert earlier_failure(record, 1) is None and not record.exists()


@pytest.mark.parametrize(
    "module", ["emb.training.train", "emb.evaluation.evaluate", "emb.evaluation.predict"]
)
def test_more_processes_than_gpus_is_refused_before_torchrun(module: str) -> None:
    """On a (faked) one-GPU machine, two processes would give rank 1 ``cuda:1`` and hang: the
    launcher every stage starts through refuses in one line, exit 2, before starting anything."""
    cmd = fake_gpu_command(1, "emb.cluster.launch", "--nproc-per-node", "2", "--", module)
    done = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""  # no "launch:" line: torchrun never started
    assert done.stderr.splitlines() == [
        "error: 2 processes per node but 1 visible GPU(s): rank 1 would get cuda:1, which does"
        " not exist; use at most 1 (tasks_per_node, config launch.nproc_per_node or"
        " --nproc-per-node)"
    ]


def test_processes_that_fit_the_gpus_launch() -> None:
    cmd = fake_gpu_command(2, "emb.cluster.launch", "--nproc-per-node", "2", "--dry-run", "--",
                           "emb.training.train")  # fmt: skip
    done = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--nproc_per_node=2" in done.stdout


def test_each_srun_task_checks_its_own_gpus(tmp_path: Path) -> None:
    """Under srun (or a container) the node command runs in ``--supervise``: the check is there,
    with the processes per node the launcher exported. The task's command and environment are
    the launcher's own (``prepare``), run as srun runs them on each node (issue 42)."""
    base = {k: v for k, v in venv_env().items() if k != NPROC_ENV and not k.startswith("SLURM_")}
    for nproc, expected in ((2, 2), (1, 0)):
        args = parse_args(["--srun", "--nproc-per-node", str(nproc), "--", "json.tool",
                           "--help"])  # fmt: skip
        _, cmd, env = prepare(args, base)
        task = cmd[cmd.index("python") + 3 :]  # srun's options and "python -m MODULE" dropped
        assert task[0] == "--supervise"
        done = subprocess.run(fake_gpu_command(1, "emb.cluster.launch", *task), env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == expected, done.stderr
        if expected:
            assert f"{nproc} processes per node but 1 visible GPU(s)" in done.stderr

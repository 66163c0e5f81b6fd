"""Two nodes on one machine: two torchrun agents, each started by emb's launcher as one node of
a 2-node job (``--endpoint``), meeting through c10d on 127.0.0.1 (gloo on CPU, one process per
node), running the real trainer on the tiny demo.

Each node may get its own run folder (a copy of the same config.yaml): what a rank writes then
lands on its own node's disk, so a file written once per node instead of once per job shows up
in the second folder. Rank 0 is whichever node the rendezvous puts first: found by the
``ranks/rank0.json`` that rank writes itself.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import TinyDemo, venv_env
from fake_gpus import fake_gpu_command
from training_runs import assert_bitwise_equal, resolve_config, resumable_state, wait_for_step

from emb.cluster.supervise import EX_TEMPFAIL
from emb.cluster.watch import PORT_OFFSET
from emb.training import checkpoint_file

pytestmark = pytest.mark.slow
EPOCHS = 2  # 3 optimizer steps an epoch on the tiny demo with a global batch of 8 (today)
WAIT_S = 10  # --rdzv-timeout where a node is meant to wait in vain


def free_port() -> int:
    """A port free on 127.0.0.1, with the launchers' store port above it free too; both
    below Linux's ephemeral range (from 32768), where other tests' outgoing connections and
    gloo's listeners take ports while these wait."""
    for _ in range(100):
        port = random.randint(20000, 32767 - PORT_OFFSET)
        try:
            for p in (port, port + PORT_OFFSET):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise AssertionError("no free port pair")


def env() -> dict[str, str]:
    return {**venv_env(), "GLOO_SOCKET_IFNAME": "lo"}  # every byte over loopback


def launcher_args(config: Path, *options: str) -> list[str]:
    return [*options, "--checkpoint", str(config.parent / "last.pt"), "--",
            "emb.training.train", "--config", str(config)]  # fmt: skip


def start_node(
    config: Path, name: str, port: int, log: Path, nproc: int = 1, timeout: int = 120,
    gpus: int | None = None,
) -> subprocess.Popen:  # fmt: skip
    """Node ``name`` ("node0" hosts the rendezvous) of a 2-node job, as its launcher."""
    options = ["--nodes", "2", "--nproc-per-node", str(nproc),
               "--endpoint", f"127.0.0.1:{port}", "--run-id", f"job{port}",
               "--hosts-endpoint", "yes" if name == "node0" else "no",
               "--node-name", name, "--rdzv-timeout", str(timeout)]  # fmt: skip
    args = launcher_args(config, *options)
    cmd = (fake_gpu_command(gpus, "emb.cluster.launch", *args) if gpus is not None
           else [sys.executable, "-m", "emb.cluster.launch", *args])  # fmt: skip
    with open(log, "w") as fh:
        return subprocess.Popen(cmd, env=env(), stdout=fh, stderr=subprocess.STDOUT)


def one_node(config: Path, nproc: int = 2) -> subprocess.CompletedProcess:
    """The same run on one node: the launcher with ``nproc`` processes (torchrun standalone)."""
    cmd = [sys.executable, "-m", "emb.cluster.launch",
           *launcher_args(config, "--nproc-per-node", str(nproc))]  # fmt: skip
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)


def finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            kill_node(p)


def kill_node(proc: subprocess.Popen) -> None:
    """The whole node at once: launcher, torchrun agent and its workers (their own session)."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait()


def rank_of(proc: subprocess.Popen, timeout: float = 60) -> int:
    """The global rank of the (one) training worker below launcher ``proc``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "emb.training.train" in " ".join(child.cmdline()) and "RANK" in child.environ():
                    return int(child.environ()["RANK"])
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no training worker below launcher {proc.pid}")


def steps_per_epoch(log: Path, proc: subprocess.Popen, timeout: float = 120) -> int:
    """The optimizer steps of one epoch, from the first line of rank 0's run log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"(\d+) optimizer steps per epoch", log.read_text())
        if found:
            return int(found.group(1))
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"no plan line in {log} within {timeout} s")


def files(folder: Path) -> set[str]:
    """Relative paths of every file in ``folder`` (TensorBoard's, whose names hold the host
    and pid, as ``tb/*``)."""
    found = set()
    for path in folder.rglob("*"):
        if path.is_file():
            rel = path.relative_to(folder).as_posix()
            found.add("tb/*" if rel.startswith("tb/") else rel)
    return found


@pytest.fixture(scope="module")
def config_text(tiny_demo: TinyDemo, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("two_nodes_config")
    config = resolve_config(tiny_demo, folder, f"train.epochs={EPOCHS}", "train.patience=1000",
                            "logging.log_every=1")  # fmt: skip
    return config.read_text()


def run_folder(root: Path, text: str) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(text)
    return root / "config.yaml"


@pytest.fixture(scope="module")
def runs(config_text: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same config trained as 1 node x 2 processes and as 2 nodes x 1 process."""
    root = tmp_path_factory.mktemp("two_nodes")
    one = run_folder(root / "one", config_text)
    tick = time.monotonic()
    done = one_node(one)
    one_s = time.monotonic() - tick
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    port = free_port()
    configs = {n: run_folder(root / n, config_text) for n in ("node0", "node1")}
    tick = time.monotonic()
    procs = [start_node(configs[n], n, port, root / f"{n}.log") for n in configs]
    codes = finish(procs)
    two_s = time.monotonic() - tick
    logs = {n: (root / f"{n}.log").read_text() for n in configs}
    assert codes == [0, 0], "\n".join(text[-3000:] for text in logs.values())
    print(f"wall time, same data: 1 node x 2 processes {one_s:.1f} s, "
          f"2 nodes x 1 process {two_s:.1f} s")  # fmt: skip
    return {"one": one.parent, "nodes": {n: c.parent for n, c in configs.items()}, "logs": logs}


def test_two_nodes_train_the_same_weights_as_one_node_with_the_same_global_batch(runs) -> None:
    """Same global batch (2 ranks x 4), same shards per global rank: the reductions see the same
    numbers in the same order, so the weights are bitwise equal, not merely close."""
    (first,) = [d for d in runs["nodes"].values() if (d / "ranks" / "rank0.json").exists()]
    for name in ("last.pt", "best.pt"):
        assert_bitwise_equal(resumable_state(runs["one"] / name), resumable_state(first / name),
                             name)  # fmt: skip
    assert (first / "history.csv").read_text().count("\n") == EPOCHS + 1


def test_every_file_of_the_run_is_written_once_by_global_rank_zero(runs) -> None:
    """The rank-0 node's folder holds what the one-node run holds but rank 1's record; the
    other node's folder holds its config and rank 1's record, nothing else."""
    by_rank = {r: [n for n, d in runs["nodes"].items() if (d / "ranks" / f"rank{r}.json").exists()]
               for r in (0, 1)}  # fmt: skip
    assert len(by_rank[0]) == len(by_rank[1]) == 1 and by_rank[0] != by_rank[1], by_rank
    first, other = runs["nodes"][by_rank[0][0]], runs["nodes"][by_rank[1][0]]
    assert files(first) == files(runs["one"]) - {"ranks/rank1.json"}
    assert files(other) == {"config.yaml", "ranks/rank1.json"}
    assert "train.json" in files(first) and "tb/*" in files(first)


def test_each_node_runs_its_own_launcher_and_agent(runs) -> None:
    """Both nodes started torchrun as one of 2 nodes at the loopback endpoint; only rank 0's
    node printed the run log."""
    for log in runs["logs"].values():
        assert "launch: torchrun --nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:" in log
    printed = [n for n, log in runs["logs"].items() if "world size 2, batch 4 per rank" in log]
    assert len(printed) == 1


def test_a_stop_asked_on_one_node_stops_both_and_resumes_on_one_node(
    runs, config_text: str, tmp_path: Path
) -> None:
    """SIGUSR1 to the launcher of the node without rank 0 only: its worker flags the stop, the
    ranks agree, rank 0 (on the other node) writes last.pt, both launchers exit 75; one node
    with 2 processes resumes it to the same weights as the run never stopped."""
    config = run_folder(tmp_path / "run", config_text)  # one folder: a shared file system
    port = free_port()
    procs = {n: start_node(config, n, port, tmp_path / f"{n}.log") for n in ("node0", "node1")}
    ranks = {n: rank_of(p) for n, p in procs.items()}
    first = min(ranks, key=ranks.get)
    other = max(ranks, key=ranks.get)
    wait_for_step(tmp_path / f"{first}.log", 1, procs[first])
    procs[other].send_signal(signal.SIGUSR1)
    codes = dict(zip(procs, finish(list(procs.values())), strict=True))
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in procs}
    assert codes == {"node0": EX_TEMPFAIL, "node1": EX_TEMPFAIL}, logs
    state = checkpoint_file.load(config.parent / "last.pt")
    assert not state["finished"]
    stopped = {r: json.loads((config.parent / "ranks" / f"rank{r}.stopped.json").read_text())
               for r in (0, 1)}  # fmt: skip
    assert stopped[1]["reason"] == "signal SIGUSR1"
    assert stopped[0]["reason"] == "another rank asked to stop"
    assert stopped[0]["step"] == stopped[1]["step"] == state["step"]
    resumed = one_node(config)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resumed from {config.parent / 'last.pt'}" in resumed.stdout
    assert_bitwise_equal(resumable_state(runs["one"] / "last.pt"),
                         resumable_state(config.parent / "last.pt"), "resumed")  # fmt: skip


@pytest.mark.parametrize("lost", ["node1", "node0"])
def test_a_lost_node_ends_the_other_with_its_name_and_a_retry_resumes(
    lost: str, config_text: str, tmp_path: Path
) -> None:
    """One node killed whole mid-epoch (node0 also holds the rendezvous and the launchers'
    store): the other exits within a minute, naming it, with 75; the job's retry (both nodes
    again) resumes from the last checkpoint and finishes."""
    config = run_folder(tmp_path / "run", config_text.replace(f"epochs: {EPOCHS}", "epochs: 6"))
    port = free_port()
    procs = {n: start_node(config, n, port, tmp_path / f"{n}.log") for n in ("node0", "node1")}
    first = min(procs, key=lambda n: rank_of(procs[n]))
    per_epoch = steps_per_epoch(tmp_path / f"{first}.log", procs[first])
    wait_for_step(tmp_path / f"{first}.log", 2 * per_epoch + 1, procs[first])  # epoch 3
    saved = checkpoint_file.load(config.parent / "last.pt")["step"]  # epoch 2's at least
    tick = time.monotonic()
    kill_node(procs[lost])
    (survivor,) = [n for n in procs if n != lost]
    code = finish([procs[survivor]], timeout=120)[0]
    took = time.monotonic() - tick
    log = (tmp_path / f"{survivor}.log").read_text()
    assert took < 60, f"{survivor} took {took:.0f} s after {lost} was lost"
    assert code == EX_TEMPFAIL, log[-3000:]
    named = f"lost {lost}" if lost == "node1" else "lost the first node"
    assert f"error: {survivor}: {named}" in log, log[-3000:]
    port = free_port()
    retry = {n: start_node(config, n, port, tmp_path / f"r{n}.log") for n in procs}
    assert finish(list(retry.values())) == [0, 0]
    text = "".join((tmp_path / f"r{n}.log").read_text() for n in procs)
    assert f"resumed from {config.parent / 'last.pt'} at epoch" in text
    assert checkpoint_file.load(config.parent / "last.pt")["step"] == 6 * per_epoch > saved


def test_a_node_waits_for_a_first_node_that_starts_late(config_text: str, tmp_path: Path) -> None:
    """node1's torchrun up 15 s before node0 (which hosts the rendezvous) starts: it waits
    (--rdzv-timeout 60), and both train."""
    config = run_folder(tmp_path / "run", config_text.replace(f"epochs: {EPOCHS}", "epochs: 1"))
    port = free_port()
    log = tmp_path / "node1.log"
    late = start_node(config, "node1", port, log, timeout=60)
    deadline = time.monotonic() + 60
    while "launch: torchrun" not in log.read_text():
        assert late.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(15)
    assert late.poll() is None, log.read_text()[-3000:]
    first = start_node(config, "node0", port, tmp_path / "node0.log", timeout=60)
    assert finish([first, late]) == [0, 0]
    assert (config.parent / "train.json").is_file()


def test_a_first_node_that_never_comes_ends_the_wait_at_the_stated_timeout(
    config_text: str, tmp_path: Path
) -> None:
    config = run_folder(tmp_path / "run", config_text)
    tick = time.monotonic()
    alone = start_node(config, "node1", free_port(), tmp_path / "node1.log", timeout=WAIT_S)
    code = finish([alone], timeout=WAIT_S + 90)[0]
    took = time.monotonic() - tick
    log = (tmp_path / "node1.log").read_text()
    assert code != 0 and took >= WAIT_S, log[-3000:]
    assert took < WAIT_S + 60, f"{took:.0f} s for a {WAIT_S} s timeout"
    assert "error: node1: waited for the first node (store 127.0.0.1:" in log, log[-3000:]
    assert f"never reached in {WAIT_S} s" in log and "not all 2 nodes started" in log
    assert log.splitlines()[-1].startswith("error: node1: waited for the first node"), log[-3000:]
    # torchrun's traceback cut to its exception; no C++ stack dump (torch's, or the heartbeat's)
    assert "Traceback" not in log and "Exception raised from" not in log, log[-3000:]
    assert not (config.parent / "last.pt").exists()


def test_each_node_checks_its_own_gpus(config_text: str, tmp_path: Path) -> None:
    """node1 sees 1 (faked) GPU for 2 processes: its launcher refuses before torchrun, naming
    itself; node0 (CPU) waits for it until the rendezvous timeout and says so."""
    config = run_folder(tmp_path / "run", config_text)
    port = free_port()
    node0 = start_node(config, "node0", port, tmp_path / "node0.log", nproc=2, timeout=WAIT_S)
    node1 = start_node(config, "node1", port, tmp_path / "node1.log", nproc=2, gpus=1)
    codes = finish([node0, node1], timeout=WAIT_S + 120)
    logs = [(tmp_path / f"node{i}.log").read_text() for i in (0, 1)]
    assert codes[1] == 2, logs[1][-3000:]
    assert "2 processes per node but 1 visible GPU(s)" in logs[1]
    assert "launch:" not in logs[1]  # torchrun never started there
    assert codes[0] != 0
    assert "error: node0: waited for 1 node(s) that never came" in logs[0], logs[0][-3000:]

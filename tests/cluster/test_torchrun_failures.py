"""What is left after torchrun fails or dies under the launcher, or the launcher dies: the
launcher's line last, no traceback of torchrun's where that line explains, and no worker
running on (real torchrun, gloo on CPU)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
from conftest import TinyDemo, venv_env
from test_launch import start_probe
from test_two_nodes import free_port
from training_runs import resolve_config, wait_for_step, workers

WAIT_S = 3  # --rdzv-timeout of a node that waits in vain
GONE_S = 5.0  # workers gone after their agent's death (measured: 0.1 s)
EXIT_S = 10.0  # the launcher's exit after it (measured: 1-2 s, its torch import's teardown)


def test_a_node_left_alone_ends_in_the_launchers_line_not_torchruns_traceback() -> None:
    """node0 of 2, whose second node never starts: torchrun's RendezvousTimeoutError
    traceback (~40 lines of its frames) is cut to its exception, and the launcher's line says
    what happened, last."""
    cmd = [sys.executable, "-m", "emb.cluster.launch", "--nodes", "2",
           "--endpoint", f"127.0.0.1:{free_port()}", "--run-id", "alone", "--hosts-endpoint",
           "yes", "--node-name", "node0", "--rdzv-timeout", str(WAIT_S), "--", "json.tool",
           os.devnull]  # fmt: skip
    done = subprocess.run(cmd, env=venv_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-2:] == [
        "torchrun: RendezvousTimeoutError",
        f"error: node0: waited for 1 node(s) that never came in {WAIT_S} s (--rdzv-timeout): not"
        " all 2 nodes started; exit 1",
    ]


def running(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return process.status() != psutil.STATUS_ZOMBIE
    return False


def test_a_killed_torchrun_agent_leaves_no_worker_running(tiny_demo: TinyDemo, tmp_path: Path):
    """The agent alone SIGKILLed mid-training (its workers run in sessions of their own, so
    they used to train on): the launcher kills its workers at once and exits only once they
    are gone, so the job's retry never runs beside them."""
    config = resolve_config(tiny_demo, tmp_path / "run", "train.epochs=100",
                            "train.patience=1000", "logging.log_every=1")  # fmt: skip
    log = tmp_path / "launch.log"
    cmd = [sys.executable, "-m", "emb.cluster.launch", "--nproc-per-node", "2", "--",
           "emb.training.train", "--config", str(config)]  # fmt: skip
    with open(log, "w") as fh:
        launcher = subprocess.Popen(cmd, env=venv_env(), stdout=fh, stderr=subprocess.STDOUT)
    ranks = workers(launcher, 2)
    try:
        wait_for_step(log, 1, launcher)
        (agent,) = [p for p in psutil.Process(launcher.pid).children()
                    if "torchrun" in " ".join(p.cmdline())]  # fmt: skip
        tick = time.monotonic()
        agent.kill()
        psutil.wait_procs(list(ranks.values()), timeout=GONE_S)
        gone_s = time.monotonic() - tick
        code = launcher.wait(timeout=60)
        exit_s = time.monotonic() - tick
        left = [rank for rank, process in ranks.items() if running(process)]
    finally:  # whatever the outcome, nothing of the test trains on
        for process in ranks.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        launcher.kill()
        launcher.wait()
    text = log.read_text()
    assert left == [], f"ranks {left} still train after their launcher exited:\n{text[-3000:]}"
    assert gone_s < GONE_S and exit_s < EXIT_S, f"workers gone {gone_s:.1f} s, exit {exit_s:.1f} s"
    assert code == 128 + 9, text[-3000:]
    killed = r"^error: torchrun \(pid \d+\) was killed by SIGKILL and left 2 process\(es\) running"
    assert re.search(killed + r" \(pids \d+, \d+\): killed them", text, re.M), text[-3000:]
    print(f"agent SIGKILLed: workers gone in {gone_s:.2f} s, launcher exit {exit_s:.2f} s")


def test_a_killed_launcher_stops_its_agent_and_the_agent_its_workers(tmp_path: Path) -> None:
    """The launcher alone SIGKILLed (an operator, a test's timeout): its torchrun gets SIGTERM
    (the parent-death signal) and stops its workers as on any SIGTERM; nothing runs on."""
    launcher = start_probe(tmp_path, nproc=2)
    tree = psutil.Process(launcher.pid).children(recursive=True)  # torchrun and its 2 workers
    assert len(tree) == 3, tree
    tick = time.monotonic()
    launcher.kill()
    launcher.wait()
    _, alive = psutil.wait_procs(tree, timeout=30)
    took = time.monotonic() - tick
    for process in alive:  # whatever the outcome, nothing of the test runs on
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    assert alive == [], f"still running {took:.0f} s after their launcher's death: {alive}"
    for rank in (0, 1):
        assert set((tmp_path / f"stopped{rank}").read_text().split()) == {"SIGTERM"}
    print(f"launcher SIGKILLed: torchrun and its workers gone in {took:.2f} s")

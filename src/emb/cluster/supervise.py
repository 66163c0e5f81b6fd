"""Run one command under supervision: stop signals forwarded, a resumable stop turned into 75.

Signals: every process of a SLURM step receives the signal, torchrun's agent included, and a
torchrun older than 2.9 cannot be told to survive SIGUSR1. So each node command is started with
SIGUSR1 ignored (inherited by torchrun; the trainer installs its own handler), and the
supervisor forwards SIGUSR1 to the whole process tree below it and SIGTERM/SIGINT to its child
(torchrun passes those to its workers). The trainer then checkpoints at its next step and exits
75; :func:`resumable_exit` turns a failure after writing the checkpoint during this launch into
75 (stopped early, resumable), so Snakemake's retry resumes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

EX_TEMPFAIL = 75  # "stopped early, resumable" (the trainer's exit code, sysexits.h)


class LaunchError(ValueError):
    """A launch that cannot be started as asked."""


def descendants(parents: Mapping[int, int], root: int) -> list[int]:
    """Every process below ``root`` in a ``{pid: parent pid}`` table, nearest first."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def process_parents() -> dict[int, int]:
    """``{pid: parent pid}`` of every process readable under /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            table[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return table


def supervise(cmd: list[str], env: Mapping[str, str] | None = None) -> int:
    """Run ``cmd`` with SIGUSR1 ignored in it; forward stop signals; return its exit code.

    SIGUSR1 goes to ``cmd`` and every process below it (the training workers; torchrun's agent
    ignores it); SIGTERM and SIGINT go to ``cmd`` itself (torchrun relays them to its workers).
    """
    if shutil.which(cmd[0], path=(env or os.environ).get("PATH")) is None:
        raise LaunchError(f"{cmd[0]!r} not found on PATH")
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # inherited: exec keeps ignored signals
    child = subprocess.Popen(cmd, env=None if env is None else dict(env))

    def to_tree(signum: int, _frame) -> None:
        for pid in [child.pid, *descendants(process_parents(), child.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def to_child(signum: int, _frame) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGUSR1, to_tree)
    signal.signal(signal.SIGTERM, to_child)
    signal.signal(signal.SIGINT, to_child)
    code = child.wait()  # handlers run meanwhile; wait() resumes after each (PEP 475)
    return code if code >= 0 else 128 - code


def resumable_exit(code: int, checkpoint: Path | None, started: float) -> int:
    """75 when the command failed after writing ``checkpoint`` during this launch, else ``code``."""
    fresh = checkpoint is not None and checkpoint.exists() and checkpoint.stat().st_mtime >= started
    return EX_TEMPFAIL if code != 0 and fresh else code

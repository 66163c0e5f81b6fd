"""Run one command under supervision: stop signals forwarded, a resumable stop turned into 75.

Signals: every process of a SLURM step receives the signal, torchrun's agent included, and a
torchrun older than 2.9 cannot be told to survive SIGUSR1. So each node command is started with
SIGUSR1 ignored (inherited by torchrun; the trainer installs its own handler), and the
supervisor forwards SIGUSR1 to the whole process tree below it and SIGTERM/SIGINT to its child
(torchrun passes those to its workers). The trainer then checkpoints at its next step and exits
75; :func:`resumable_exit` turns a failure after writing the checkpoint during this launch into
75 (stopped early, resumable), so Snakemake's retry resumes it.

No orphans: torchrun starts its workers in sessions of their own, so an agent that dies
(SIGKILL, a crash) used to leave them training, writing checkpoints beside the job's retry. The
supervisor is the child subreaper of everything below it (``PR_SET_CHILD_SUBREAPER``): orphans
become its children, and when the command has ended it kills (SIGKILL) every process still
below it and returns only once they are gone (:func:`stop_leftovers`), so nothing of this
launch outlives it, and no retry can start beside it. The other way round, a supervisor killed
alone (SIGKILL, a test's timeout) would leave torchrun training on: the command gets SIGTERM
when its supervisor dies (``PR_SET_PDEATHSIG``, :func:`with_parent_death`), and torchrun stops
its workers as on any SIGTERM.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from emb.cluster.torchrun_output import TorchrunOutput

EX_TEMPFAIL = 75  # "stopped early, resumable" (the trainer's exit code, sysexits.h)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # linux/prctl.h
# exec'd in the child: preexec_fn is not safe beside the heartbeat's thread
PARENT_DEATH = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, {int(signal.SIGTERM)}, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"  # the supervisor died before the line above
    "    sys.exit(f'error: {sys.argv[2]} not started: its supervisor ended first')\n"
    "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"  # as subprocess leaves them for exec
    "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
LEFTOVER_WAIT_S = 30.0  # SIGKILL cannot be caught: only a process stuck in the kernel takes long


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


def become_subreaper() -> bool:
    """Make orphans below this process its children (Linux; elsewhere a no-op, False)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def with_parent_death(cmd: list[str]) -> list[str]:
    """``cmd``, made to receive SIGTERM when this process dies (Linux; elsewhere as it is)."""
    if not sys.platform.startswith("linux"):
        return cmd
    return [sys.executable, "-c", PARENT_DEATH, str(os.getpid()), *cmd]


def is_zombie(pid: int) -> bool:
    """Whether ``pid`` has ended and waits to be reaped (or is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


def stop_leftovers(what: str, code: int) -> list[int]:
    """Kill (SIGKILL) and reap every process still below this one after its command ``what``
    ended with ``code``; returns the pids that were still running. Waits until they are gone,
    ``LEFTOVER_WAIT_S`` at most, naming any that outlive it."""
    me = os.getpid()
    running = [p for p in descendants(process_parents(), me) if not is_zombie(p)]
    deadline, foreign, tree = time.monotonic() + LEFTOVER_WAIT_S, set(), []
    while time.monotonic() < deadline:
        tree = [p for p in descendants(process_parents(), me) if p not in foreign]
        if not tree:
            break
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except PermissionError:  # another user's (a setuid helper): not ours to end
                foreign.add(pid)
            except ProcessLookupError:
                pass
            with contextlib.suppress(ChildProcessError):  # reaped once orphaned to this one
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.01)
    ended = f"was killed by {signal_name(-code)}" if code < 0 else f"exited {code}"
    if running:
        still = f"; still there after {LEFTOVER_WAIT_S:.0f} s: pids {tree}" if tree else ""
        print(f"error: {what} {ended} and left {len(running)} process(es) running (pids "
              f"{', '.join(map(str, running))}): killed them, so nothing of this launch runs "
              f"beside a retry{still}", file=sys.stderr, flush=True)  # fmt: skip
    elif code < 0:
        print(f"error: {what} {ended}", file=sys.stderr, flush=True)
    return running


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def supervise(
    cmd: list[str], env: Mapping[str, str] | None = None, output: TorchrunOutput | None = None
) -> int:
    """Run ``cmd`` with SIGUSR1 ignored in it; forward stop signals; return its exit code once
    nothing below this process runs any more (:func:`stop_leftovers`).

    SIGUSR1 goes to ``cmd`` and every process below it (the training workers; torchrun's agent
    ignores it); SIGTERM and SIGINT go to ``cmd`` itself (torchrun relays them to its workers).
    With ``output``, ``cmd``'s stderr goes through it (torchrun's traceback held back).
    """
    if shutil.which(cmd[0], path=(env or os.environ).get("PATH")) is None:
        raise LaunchError(f"{cmd[0]!r} not found on PATH")
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # inherited: exec keeps ignored signals
    become_subreaper()
    child = subprocess.Popen(with_parent_death(cmd), env=None if env is None else dict(env),
                             stderr=None if output is None else subprocess.PIPE)  # fmt: skip
    if output is not None:
        output.read(child.stderr)

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
    stop_leftovers(f"{Path(cmd[0]).name} (pid {child.pid})", code)
    return code if code >= 0 else 128 - code


def resumable_exit(code: int, checkpoint: Path | None, started: float) -> int:
    """75 when the command failed after writing ``checkpoint`` during this launch, else ``code``."""
    fresh = checkpoint is not None and checkpoint.exists() and checkpoint.stat().st_mtime >= started
    return EX_TEMPFAIL if code != 0 and fresh else code

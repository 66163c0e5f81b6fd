"""Probe for the launcher's signal path: a process that follows the trainer's stop protocol.

Run as ``torchrun ... -m stopprobe OUT_DIR`` (tests/slurm on PYTHONPATH). Each rank writes
``ready{rank}`` and waits for SIGUSR1 or SIGTERM (60 s at most; without a signal it exits 0).
Once signalled it writes ``signalled{rank}``, waits until every rank has, and records in
``stopped{rank}`` the signals it got until then (one line per delivery); rank 0 writes
``OUT_DIR/last.pt``; each rank exits 75 only when every rank has written its record.

The waits are on the other ranks' files, not on time: torchrun sends SIGTERM to the ranks
still running when one rank exits, so a rank that exited while another had not recorded yet
(under load, seconds later) put that SIGTERM into the other's record.
"""

import os
import signal
import sys
import time
from pathlib import Path

out, rank = Path(sys.argv[1]), os.environ.get("RANK", "0")
ranks = [str(r) for r in range(int(os.environ.get("WORLD_SIZE", "1")))]
got: list[str] = []


def flag(signum: int, _frame) -> None:
    got.append(signal.Signals(signum).name)


def every_rank_wrote(prefix: str, deadline: float) -> bool:
    """Wait until ``{prefix}{r}`` exists for every rank (False at ``deadline``: a rank is lost,
    and the test fails on its missing record)."""
    while not all((out / f"{prefix}{r}").exists() for r in ranks):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def write(name: str, text: str) -> None:
    """Whole or absent: the other ranks poll for the name."""
    part = out / f".{name}.part"
    part.write_text(text)
    part.rename(out / name)


signal.signal(signal.SIGUSR1, flag)
signal.signal(signal.SIGTERM, flag)
write(f"ready{rank}", str(os.getpid()))
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.05)
if not got:
    sys.exit(0)
write(f"signalled{rank}", got[0])
every_rank_wrote("signalled", time.time() + 60)  # every rank reached: deliveries are done
write(f"stopped{rank}", "\n".join(got))  # no rank has exited yet: nothing from torchrun here
if rank == "0":
    (out / "last.pt").write_text("checkpoint")
every_rank_wrote("stopped", time.time() + 60)
sys.exit(75)

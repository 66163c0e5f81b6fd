"""Probe for the launcher's signal path: a process that follows the trainer's stop protocol.

Run as ``torchrun ... -m stopprobe OUT_DIR`` (tests/slurm on PYTHONPATH). Each rank writes
``ready{rank}``, waits for SIGUSR1 or SIGTERM (60 s at most), records which one it got in
``stopped{rank}`` (one line per delivery), rank 0 writes ``OUT_DIR/last.pt``, and all exit 75.
Without a signal it exits 0.
"""

import os
import signal
import sys
import time
from pathlib import Path

out, rank = Path(sys.argv[1]), os.environ.get("RANK", "0")
got: list[str] = []


def flag(signum: int, _frame) -> None:
    got.append(signal.Signals(signum).name)


signal.signal(signal.SIGUSR1, flag)
signal.signal(signal.SIGTERM, flag)
(out / f"ready{rank}").write_text(str(os.getpid()))
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.05)
if not got:
    sys.exit(0)
time.sleep(0.5)  # a late second delivery lands in the record too
(out / f"stopped{rank}").write_text("\n".join(got))
if rank == "0":
    (out / "last.pt").write_text("checkpoint")
sys.exit(75)

"""What SLURM knows about the running job, asked through its own commands (``squeue``,
``scontrol``): the one place the job's end time and first node are parsed."""

from __future__ import annotations

import os
import re
import subprocess
import time


class SlurmError(RuntimeError):
    """A SLURM command that failed or could not be run."""


def job_end_time(job_id: str) -> int | None:
    """SLURM's end time of ``job_id`` as Unix seconds (None when SLURM does not know one)."""
    end = _slurm(["squeue", "-h", "-j", job_id, "-o", "%e"])
    try:
        return int(time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def first_node(job_id: str) -> str:
    """The first host of SLURM job ``job_id``'s allocation (where the batch script runs)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or _slurm(
        ["squeue", "-h", "-j", job_id, "-o", "%N"]
    )
    return _slurm(["scontrol", "show", "hostnames", nodelist]).split()[0]


def node_address(node: str) -> str:
    """Where ``node`` is reached (its ``NodeAddr``; the name itself where SLURM has none):
    the name need not resolve, e.g. several slurmd on one host."""
    found = re.search(r"\bNodeAddr=(\S+)", _slurm(["scontrol", "show", "node", "-o", node]))
    return found.group(1) if found else node


def _slurm(cmd: list[str]) -> str:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as err:
        raise SlurmError(f"{' '.join(cmd)} failed: {err}") from None
    return result.stdout.strip()

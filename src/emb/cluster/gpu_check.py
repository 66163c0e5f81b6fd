"""Stage: check that a job step sees the GPUs and CPUs its rule asked for, before training starts.

Snakemake's SLURM plugin wraps jobs in ``srun`` steps, and a job asking for two GPUs has been
seen to get one inside the step (snakemake-executor-plugin-slurm issue #459). Run through the
launcher in the same form as ``train`` (same resources, same ``srun``), this costs a minute and
fails loudly where training would otherwise run on a fraction of the node.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from emb.io import write_json

VISIBILITY_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                   "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NODEID")  # fmt: skip


class DeviceMismatch(RuntimeError):
    """The step sees other devices than were requested."""


def check_devices(gpus_expected: int, gpus_found: int, cpus_expected: int, cpus_found: int) -> None:
    """Raise when the step sees a different GPU count, or fewer CPUs, than requested."""
    problems = []
    if gpus_found != gpus_expected:
        problems.append(f"expected {gpus_expected} GPU(s) per node, found {gpus_found}")
    if cpus_found < cpus_expected:
        problems.append(f"expected at least {cpus_expected} CPU(s), found {cpus_found}")
    if problems:
        raise DeviceMismatch(
            "; ".join(problems) + " (check the profile's gres/--gpus-per-node and cpus_per_task)"
        )


def smi_listing() -> list[str]:
    """``nvidia-smi -L`` or ``rocm-smi --showid`` lines, where one of them is installed."""
    for cmd in (["nvidia-smi", "-L"], ["rocm-smi", "--showid"]):
        if shutil.which(cmd[0]):
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            return [line for line in result.stdout.splitlines() if line.strip()]
    return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, required=True, help="GPUs per node requested")
    parser.add_argument("--processes", type=int, default=1, help="processes per node")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("--out", type=Path, required=True, help="report (written on node 0)")
    args = parser.parse_args(argv)
    import torch

    found = torch.cuda.device_count()  # CUDA and ROCm builds alike
    cpus = len(os.sched_getaffinity(0))
    report = {
        "host": socket.gethostname(),
        "gpus_expected": args.gpus,
        "gpus_found": found,
        "devices": [torch.cuda.get_device_name(i) for i in range(found)],
        "cpus_expected": args.processes * args.threads,
        "cpus_found": cpus,
        "smi": smi_listing(),
        "env": {k: os.environ[k] for k in VISIBILITY_VARS if k in os.environ},
    }
    print(report)
    try:
        check_devices(args.gpus, found, report["cpus_expected"], cpus)
    except DeviceMismatch as err:
        print(f"error: {report['host']}: {err}", file=sys.stderr)
        sys.exit(1)
    if os.environ.get("SLURM_NODEID", "0") == "0":
        write_json(args.out, report)


if __name__ == "__main__":
    main()

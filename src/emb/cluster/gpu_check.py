"""Stage: check that a job step sees the GPUs and CPUs its rule asked for, before training starts.

Snakemake's SLURM plugin wraps jobs in ``srun`` steps, and a job asking for two GPUs has been
seen to get one inside the step (snakemake-executor-plugin-slurm issue #459). Run through the
launcher in the same form as ``train`` (same resources, same ``srun``), this costs a minute and
fails loudly where training would otherwise run on a fraction of the node.

What it expects: the number of GPUs the profile (or ``--set-resources``) gives ``gpu_check``'s
``gpus_per_node``, strictly, as the cluster profiles do; without such a setting (a local run:
the rule's own default) whatever the machine shows (``--gpus auto``), so a workstation with a
GPU just works. Either way, more processes per node than visible GPUs is refused (a rank would
get a ``cuda:N`` that does not exist).
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


RULE_DEFAULT = "the rule's default (none set: whatever the machine has)"
CPU_HINT = "cpus_per_task (config launch.threads, or the profile's gpu_check:cpus_per_task)"


def check_devices(
    gpus_expected: int | None,
    gpus_found: int,
    cpus_expected: int,
    cpus_found: int,
    *,
    processes: int = 1,
    source: str = RULE_DEFAULT,
) -> None:
    """Raise when the step sees another GPU count than requested (``None``: any count), more
    processes than GPUs on a GPU machine, or fewer CPUs than requested.

    ``source`` names where ``gpus_expected`` came from, so the message points at the setting
    that set it (never at a profile that is not in use)."""
    problems = []
    if gpus_expected is not None and gpus_found != gpus_expected:
        problems.append(
            f"expected {gpus_expected} GPU(s) per node, found {gpus_found}"
            f" (the number is gpu_check:gpus_per_node, set by {source}; make it {gpus_found}"
            " or run where the GPUs are)"
        )
    elif gpus_found and processes > gpus_found:
        problems.append(too_many_processes(processes, gpus_found))
    if cpus_found < cpus_expected:
        problems.append(
            f"expected at least {cpus_expected} CPU(s), found {cpus_found} (check {CPU_HINT})"
        )
    if problems:
        raise DeviceMismatch("; ".join(problems))


def too_many_processes(processes: int, gpus: int) -> str:
    """The one line every stage prints when a node runs more processes than it has GPUs."""
    return (
        f"{processes} processes per node but {gpus} visible GPU(s): rank {gpus} would get"
        f" cuda:{gpus}, which does not exist; use at most {gpus} (tasks_per_node, config"
        " launch.nproc_per_node or --nproc-per-node)"
    )


def expected_gpus(value: str) -> int | None:
    """``--gpus``: an integer >= 0, or ``auto`` (None: what the machine has)."""
    if value == "auto":
        return None
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or auto, found {value!r}")
    return int(value)


def smi_listing() -> list[str]:
    """``nvidia-smi -L`` or ``rocm-smi --showid`` lines, where one of them is installed."""
    for cmd in (["nvidia-smi", "-L"], ["rocm-smi", "--showid"]):
        if shutil.which(cmd[0]):
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            return [line for line in result.stdout.splitlines() if line.strip()]
    return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gpus", type=expected_gpus, required=True, help="GPUs per node requested, or auto"
    )
    parser.add_argument("--source", default=RULE_DEFAULT, help="where --gpus was set")
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the job")
    parser.add_argument("--processes", type=int, default=1, help="processes per node")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("--out", type=Path, required=True, help="report (written on node 0)")
    args = parser.parse_args(argv)
    import torch

    found = torch.cuda.device_count()  # CUDA and ROCm builds alike
    cpus = len(os.sched_getaffinity(0))
    report = {
        "host": socket.gethostname(),
        "gpus_expected": "auto" if args.gpus is None else args.gpus,
        "gpus_source": args.source,
        "gpus_found": found,
        "devices": [torch.cuda.get_device_name(i) for i in range(found)],
        "nodes": args.nodes,  # the shape checked: a changed one reruns the check
        "processes": args.processes,
        "threads": args.threads,
        "cpus_expected": args.processes * args.threads,
        "cpus_found": cpus,
        "smi": smi_listing(),
        "env": {k: os.environ[k] for k in VISIBILITY_VARS if k in os.environ},
    }
    print(report)
    try:
        check_devices(
            args.gpus, found, report["cpus_expected"], cpus,
            processes=args.processes, source=args.source,
        )  # fmt: skip
    except DeviceMismatch as err:
        print(f"error: {report['host']}: {err}", file=sys.stderr)
        sys.exit(1)
    if os.environ.get("SLURM_NODEID", "0") == "0":
        write_json(args.out, report)


if __name__ == "__main__":
    main()

"""Where and how a trained model runs for maps and evaluation: device, threads, precision.

On a GPU node a torchrun rank (evaluation, the maps of a run) uses the GPU of its local rank,
and a process started without torchrun claims one GPU of its own (an exclusive lock per
device), so processes sharing a node spread over every GPU; forward passes run under the run's
autocast precision and memory format. On a CPU a process
uses the threads its rule was given, in fp32 (CPU autocast is slower than fp32).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from emb.training.run_config import resolve_channels_last
from emb.training.trainer import autocast

_CLAIMS: list = []  # open lock files: a claim lasts as long as the process


@dataclass(frozen=True)
class Inference:
    """A device and the numerics a model runs with there."""

    device: torch.device
    precision: str = "fp32"  # bf16 | fp16 | fp32 (CPU: always fp32)
    channels_last: bool = False

    def autocast(self) -> AbstractContextManager:
        return autocast(self.device, self.precision)

    def prepare(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device).eval()
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            return x.contiguous(memory_format=torch.channels_last)
        return x


def claim_gpu(count: int, lock_dir: Path | None = None) -> int | None:
    """The index of a GPU no other process of this job holds (held until exit), or None."""
    job = os.environ.get("SLURM_JOB_ID", "local")
    folder = Path(lock_dir or tempfile.gettempdir())
    for index in range(count):
        fh = open(folder / f"emb-gpu-{job}-{index}.lock", "w")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            continue
        _CLAIMS.append(fh)
        return index
    return None


def inference(
    precision: str,
    channels_last: bool | str,
    threads: int,
    local_rank: int | None = None,
    arch: str = "",
) -> Inference:
    """The device this process uses, with the run's precision and memory format there.

    ``local_rank`` (under torchrun) picks the GPU; otherwise a free one is claimed. CPU
    processes run on ``threads`` threads in fp32. ``channels_last`` is the run's setting,
    resolved for this device and the run's ``arch`` as training resolves it.
    """
    if torch.cuda.is_available():
        index = local_rank if local_rank is not None else claim_gpu(torch.cuda.device_count())
        device = torch.device("cuda", index if index is not None else 0)
        torch.cuda.set_device(device)
        hip = bool(torch.version.hip)
        return Inference(device, precision, resolve_channels_last(channels_last, arch, "cuda", hip))
    torch.set_num_threads(max(1, threads))
    return Inference(torch.device("cpu"), "fp32", resolve_channels_last(channels_last, arch, "cpu"))

"""Where and how a model runs: the device, its precision, memory format and compilation.

A run's ``train:`` settings (``precision``, ``channels_last``, ``compile``) are resolved once
per process, for the model's architecture and the device, into a frozen :class:`Runtime`;
training (:func:`emb.training.loop.build_trainer`), evaluation and prediction all take that
object, apply it to the model (:meth:`Runtime.prepare`) and to its inputs
(:meth:`Runtime.inputs`), run forward passes under :meth:`Runtime.autocast`, and record it
(:meth:`Runtime.record`) in ``train.json``'s and the checkpoint's provenance and in
``metrics.json``. The measured rules:

- precision: as set on CUDA/ROCm; fp32 on a CPU (CPU autocast is slower than fp32).
- channels_last ``auto``: DeepLab on CUDA only (:func:`resolve_channels_last`).
- compile: as set, for training; evaluation and prediction run the model eagerly.

For evaluation and prediction :func:`claim_device` picks the device: a torchrun rank takes the
GPU of its local rank, a process started without torchrun claims one GPU of its own (an
exclusive lock per device), so processes sharing a node spread over every GPU; on a CPU the
process uses the threads its rule gave it. Pure but for that: nothing here reads the command
line, and the environment only for ``SLURM_JOB_ID`` (the claim's lock-file name).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from emb.models.flat_tensors import flatten_

PRECISIONS = ("bf16", "fp16", "fp32")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

_CLAIMS: list = []  # open lock files: a claim lasts as long as the process


class RunSettings(Protocol):
    """The ``train:`` settings a runtime is resolved from (``LoopConfig`` has them)."""

    precision: str
    channels_last: bool | str
    compile: bool


def resolve_precision(setting: str, device_type: str) -> str:
    """train.precision on one device: as set on a GPU, fp32 on a CPU (CPU autocast is slower
    than fp32)."""
    if setting not in PRECISIONS:
        raise ValueError(f"train.precision: expected one of {list(PRECISIONS)}, found {setting!r}")
    return setting if device_type == "cuda" else "fp32"


def resolve_channels_last(
    setting: bool | str, arch: str, device_type: str, hip: bool = False
) -> bool:
    """train.channels_last for one model on one device; ``auto`` is what was measured.

    On CUDA channels_last made DeepLab's step 1.10-1.28x faster and SegFormer's 0.97-1.03x
    (issue 31, H200); ROCm keeps NHWC opt-in (MIOpen's NHWC depthwise/grouped kernels are
    slow) and CPUs were not measured, so ``auto`` is off there. true/false are taken as set.
    """
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ValueError(f"train.channels_last: expected auto, true or false, found {setting!r}")
    return arch == "deeplab" and device_type == "cuda" and not hip


@dataclass(frozen=True)
class Runtime:
    """A device and the resolved numerics a model runs with there (see the module's rules)."""

    device: torch.device
    precision: str = "fp32"  # bf16 | fp16 | fp32, as resolved (a CPU: fp32)
    channels_last: bool = False
    compile: bool = False  # torch.compile inside DDP (training only)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            found = self.precision
            raise ValueError(f"precision: expected one of {list(PRECISIONS)}, found {found!r}")
        if not isinstance(self.channels_last, bool):  # "auto" is resolved before, never here
            raise ValueError(
                f"channels_last: expected the resolved true or false, found "
                f"{self.channels_last!r} (resolve it with Runtime.resolve)"
            )

    @classmethod
    def resolve(
        cls, settings: RunSettings, arch: str, device: torch.device, *, training: bool,
        hip: bool | None = None,
    ) -> Runtime:  # fmt: skip
        """The run's ``settings`` for ``arch`` on ``device`` (``hip``: a ROCm build; None asks
        this PyTorch); ``training`` False leaves compilation off."""
        hip = bool(torch.version.hip) if hip is None else hip
        return cls(
            device,
            resolve_precision(settings.precision, device.type),
            resolve_channels_last(settings.channels_last, arch, device.type, hip),
            bool(settings.compile) and training,
        )

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format

    def autocast(self) -> AbstractContextManager:
        """Autocast to bf16/fp16 when resolved so; fp32 runs without autocast."""
        if self.precision not in AUTOCAST_DTYPES:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[self.precision])

    def prepare(self, model: nn.Module, *, training: bool = False) -> nn.Module:
        """``model`` on the device in the resolved memory format; in eval mode, or for
        ``training`` with its parameters and buffers in one flat tensor per dtype unless it will
        be compiled (a compiled graph would see its inputs alias): the EMA and the non-finite
        guard then cost a kernel each instead of one per tensor
        (:mod:`emb.models.flat_tensors`). Compilation and DDP wrap it afterwards
        (:func:`emb.training.distributed.wrap_model`)."""
        model = model.to(self.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if not training:
            return model.eval()
        if not self.compile:
            flatten_(model, "parameters")
            flatten_(model, "buffers")
        return model

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the model's memory format (a no-op for a tensor already in it)."""
        return x.contiguous(memory_format=self.memory_format)

    def record(self) -> dict[str, str]:
        """What ran, for a provenance block (flat ``str -> str``)."""
        return {
            "device_type": self.device.type,
            "precision": self.precision,
            "channels_last": str(self.channels_last).lower(),
            "compile": str(self.compile).lower(),
        }


def claim_gpu(count: int, lock_dir: Path | None = None, job: str | None = None) -> int | None:
    """The index of a GPU no other process of this job holds (held until exit), or None.
    ``job`` names the locks (default: ``SLURM_JOB_ID``, else ``local``)."""
    job = job or os.environ.get("SLURM_JOB_ID", "local")
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


def claim_device(threads: int, local_rank: int | None = None) -> torch.device:
    """The device an evaluation or prediction process uses: ``local_rank``'s GPU under
    torchrun, else a GPU it claims (:func:`claim_gpu`; the first when every one is held), set
    as the current device; without a GPU the CPU, on ``threads`` threads."""
    if torch.cuda.is_available():
        index = local_rank if local_rank is not None else claim_gpu(torch.cuda.device_count())
        device = torch.device("cuda", index if index is not None else 0)
        torch.cuda.set_device(device)
        return device
    torch.set_num_threads(max(1, threads))
    return torch.device("cpu")

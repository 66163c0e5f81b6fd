"""Where and how a model runs: the device, its precision, memory format and compilation.

One :class:`Runtime` per process, resolved once (:meth:`Runtime.resolve`) from the run's
``train:`` settings (``precision``, ``channels_last``, ``compile``, ``compile_memory_budget``),
the model's architecture, what the process finds (:class:`Host`: torchrun's local rank, the
visible GPUs, a ROCm build; read from the environment by the stage, :meth:`Host.here`) and
whether it trains. Training (:mod:`emb.training.train`, the loop, the ``Trainer``,
:func:`emb.training.distributed.wrap_model`), evaluation and prediction all take that object,
apply it to the model (:meth:`Runtime.prepare`) and to its inputs (:meth:`Runtime.inputs`),
run forward passes under :meth:`Runtime.autocast`, and record it (:meth:`Runtime.record`) in
``train.json``'s and the checkpoint's provenance, in ``metrics.json`` and in the map tags. The
measured rules:

- device: a training rank takes the GPU of its local rank; an evaluation or prediction
  process the GPU of its local rank under torchrun, else one it claims (an exclusive lock per
  device, :func:`claim_gpu`), so processes sharing a node spread over every GPU; the CPU
  without a GPU.
- precision: as set on CUDA/ROCm; fp32 on a CPU (CPU autocast is slower than fp32). The
  setting is checked here, where it enters (:func:`resolve_precision`); the run's config keeps
  it as set, and what ran is :meth:`Runtime.record`.
- GradScaler (training): as ``train.grad_scaler`` says, or with fp16 only when unset, at the
  resolved precision (:meth:`Runtime.grad_scaler`, beside :meth:`Runtime.autocast`).
- channels_last ``auto``: DeepLab on CUDA only (:func:`resolve_channels_last`).
- compile (and its memory budget): as set, for training; evaluation and prediction run the
  model eagerly.

Pure but for the claim and :meth:`Runtime.occupy`: nothing here reads the command line, and
the environment only in :meth:`Host.here` and for ``SLURM_JOB_ID`` (the claim's lock-file
name).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Mapping
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
    compile_memory_budget: float | None


def resolve_precision(setting: str, device_type: str) -> str:
    """train.precision on one device: as set on a GPU, fp32 on a CPU (CPU autocast is slower
    than fp32). The one check of the setting: every Runtime of a run is resolved through here,
    and a CPU would otherwise turn a misspelt setting into fp32 unseen."""
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
class Host:
    """What a process finds where it starts, as plain data: torchrun's ``LOCAL_RANK`` (None
    without torchrun), the GPUs it sees and whether PyTorch is a ROCm build."""

    gpus: int
    local_rank: int | None = None
    hip: bool = False

    @classmethod
    def here(cls, env: Mapping[str, str]) -> Host:
        """This process's host; ``env`` is its environment (the stage passes ``os.environ``)."""
        local = env.get("LOCAL_RANK")
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(gpus, int(local) if local is not None else None, bool(torch.version.hip))


CPU_HOST = Host(gpus=0)  # a process that runs on the CPU whatever it finds (tests, notebooks)


def pick_device(host: Host, training: bool) -> torch.device:
    """The device of a process on ``host`` (see the module's rules): a training rank the GPU of
    its local rank, an evaluation or prediction process that one under torchrun or else a GPU
    it claims (the first when every one is held); the CPU without a GPU."""
    if host.gpus == 0:
        return torch.device("cpu")
    index = host.local_rank
    if index is None:
        index = 0 if training else claim_gpu(host.gpus)
    return torch.device("cuda", index if index is not None else 0)


@dataclass(frozen=True)
class Runtime:
    """A device and the resolved numerics a model runs with there (see the module's rules)."""

    device: torch.device
    # No field has a default of its own: each is a train: setting's resolved value, whose
    # default is the schema's (train.channels_last's is auto, not false); a caller building a
    # Runtime without Runtime.resolve states every one.
    precision: str  # bf16 | fp16 | fp32 (PRECISIONS), as resolved (a CPU: fp32)
    channels_last: bool  # as resolved (resolve_channels_last): true or false, never auto
    compile: bool  # torch.compile inside DDP (training only)
    compile_memory_budget: float | None  # activation memory budget of compiled graphs

    def __post_init__(self) -> None:
        if not isinstance(self.channels_last, bool):  # "auto" is resolved before, never here
            raise ValueError(
                f"channels_last: expected the resolved true or false, found "
                f"{self.channels_last!r} (resolve it with Runtime.resolve)"
            )

    @classmethod
    def resolve(cls, settings: RunSettings, arch: str, host: Host, *, training: bool) -> Runtime:
        """The run's ``settings`` for ``arch`` on ``host``'s device (:func:`pick_device`);
        ``training`` False leaves compilation off."""
        device = pick_device(host, training)
        compiled = bool(settings.compile) and training
        return cls(
            device,
            resolve_precision(settings.precision, device.type),
            resolve_channels_last(settings.channels_last, arch, device.type, host.hip),
            compiled,
            settings.compile_memory_budget if compiled else None,
        )

    def occupy(self, threads: int | None = None) -> None:
        """Make this process use the device: the current CUDA device, or on a CPU ``threads``
        threads (None: as PyTorch chose)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        elif threads is not None:
            torch.set_num_threads(max(1, threads))

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format

    def autocast(self) -> AbstractContextManager:
        """Autocast to bf16/fp16 when resolved so; fp32 runs without autocast."""
        if self.precision not in AUTOCAST_DTYPES:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[self.precision])

    def grad_scaler(self, setting: bool | None) -> torch.amp.GradScaler | None:
        """The GradScaler a training step runs with: ``train.grad_scaler`` as set, or when unset
        (None) one with fp16 only, at the resolved precision (bf16 has fp32's range; a CPU
        runs fp32, so an fp16 setting there gets none). None: no scaler."""
        wanted = self.precision == "fp16" if setting is None else setting
        return torch.amp.GradScaler(self.device.type) if wanted else None

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

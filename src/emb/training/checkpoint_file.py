"""Checkpoints: plain dicts of tensors and primitives, written atomically, loaded safely.

Saved state never carries a ``module.`` (DDP) or ``_orig_mod.`` (torch.compile) prefix, and is
always loaded with ``weights_only=True``: a checkpoint cannot run code.

Each checkpoint ``X.pt`` has a sidecar ``X.pt.sha256`` in ``sha256sum`` format, and
:func:`load` refuses a file whose sha256 is not recorded there (bit rot, a partial copy, a file
replaced by hand). The file and its sidecar cannot be renamed together, so a save records the
new checksum *next to* the current one before the checkpoint's rename and drops the old one
after it: whenever a process is killed, the file under the final name matches a recorded
checksum (``sha256sum -c`` reads the sidecar; after a kill it may list one line too many).
"""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path
from typing import Any

import torch
from torch import nn

from emb.io import atomic_path
from emb.provenance import digest_file
from emb.training.run_config import REFERENCE_BATCH

CHECKSUM_SUFFIX = ".sha256"

PREFIXES = ("module.", "_orig_mod.")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used for this run."""


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP and/or torch.compile wrappers, in any order."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def strip_prefixes(state: dict[str, Any]) -> dict[str, Any]:
    """State-dict keys without wrapper prefixes, however they are nested."""
    out = {}
    for key, value in state.items():
        changed = True
        while changed:
            changed = False
            for prefix in PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix) :], True
        out[key] = value
    return out


class HashingWriter:
    """A binary file that hashes what is written through it (one pass, no read-back).

    ``torch.save`` turns an exception raised by ``write`` into a RuntimeError without errno
    ("unexpected pos"); the original is kept in ``error`` so a full disk is reported as such.
    """

    def __init__(self, fh) -> None:
        self.fh, self.sha256, self.error = fh, hashlib.sha256(), None

    def write(self, data) -> int:
        try:
            written = self.fh.write(data)
        except OSError as err:
            self.error = err
            raise
        self.sha256.update(data)
        return written

    def flush(self) -> None:
        self.fh.flush()


def checksum_path(path: Path) -> Path:
    """The sidecar holding ``path``'s recorded sha256: ``X.pt`` -> ``X.pt.sha256``."""
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def recorded_checksums(path: Path) -> list[str] | None:
    """The sha256 hex digests recorded for ``path``, or None when it has no sidecar."""
    sums = checksum_path(path)
    if not sums.exists():
        return None
    found = []
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        if name == Path(path).name and len(digest) == 64:
            found.append(digest)
    return found


def _write_checksums(path: Path, digests: list[str]) -> None:
    lines = "".join(f"{d}  {path.name}\n" for d in dict.fromkeys(digests))
    with atomic_path(checksum_path(path)) as tmp:
        tmp.write_text(lines)


def save(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` via a temporary file, fsync and rename; record its sha256.

    An ``OSError`` (a full disk) leaves the previous checkpoint and its sidecar intact.
    """
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            writer = HashingWriter(fh)
            try:
                torch.save(state, writer)
            except RuntimeError:
                if writer.error is not None:
                    raise writer.error from None
                raise
        digest = writer.sha256.hexdigest()
        # Before the rename: the current file's checksum and the new one are both valid.
        _write_checksums(path, [digest, *(recorded_checksums(path) or [])])
    _write_checksums(path, [digest])


def verify(path: Path) -> None:
    """Raise :class:`CheckpointError` when ``path``'s sha256 is not the one recorded for it."""
    expected = recorded_checksums(path)
    if expected is None:
        return  # written before checksums existed, or copied without its sidecar
    found = digest_file(path)
    if found not in expected:
        raise CheckpointError(
            f"{path}: sha256 {found} does not match the checksum recorded in "
            f"{checksum_path(path)} (expected {' or '.join(expected) or 'a digest line'}): the "
            "file is damaged or was replaced; if replaced on purpose, delete the .sha256 file"
        )


def _kind(path: Path) -> str:
    mode = Path(path).stat().st_mode
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket"}
    return next((name for test, name in kinds.items() if test(mode)), "a device file")


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`; refuses anything but tensors and plain data,
    and a file that does not match its recorded checksum."""
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the open forever
        raise CheckpointError(f"{path}: expected a regular checkpoint file, found {_kind(path)}")
    if Path(path).exists():
        verify(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError or RuntimeError variants
        raise CheckpointError(
            f"{path}: not a loadable emb checkpoint ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not an emb checkpoint (no 'model' state dict)")
    state["model"] = strip_prefixes(state["model"])
    if state.get("ema") is not None:
        state["ema"] = strip_prefixes(state["ema"])
    return state


def clean_leftovers(folder: Path) -> list[Path]:
    """Remove temporary files of checkpoint (and checksum) writes that a killed process left."""
    removed = []
    for pattern in (".*.pt.tmp-*", f".*.pt{CHECKSUM_SUFFIX}.tmp-*"):
        for tmp in sorted(Path(folder).glob(pattern)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def flatten_config(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"model.in_dim": 64, ...}``: a nested config as dotted keys."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten_config(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


ARCH_KEYS = ("model.", "data.source")  # a checkpoint's weights fit the model only if equal
# What a resume must find unchanged: every key that changes the math of the next steps, and
# the loader keys that decide the order of batches (reader threads, shuffle buffer), so that a
# resumed run is the uninterrupted one bit for bit. Run length (epochs, max_updates: the
# remaining cosine is re-planned from the current LR, emb.training.schedule), patience,
# checkpoints and logging may change. The precision is compared as it ran, not as set
# (check_resumable): a CPU runs fp32 whatever train.precision says.
RESUME_KEYS = (
    "model.", "data.", "loss.", "optimizer.", "schedule.", "ema.enabled", "ema.decay",
    "ema.warmup", "train.batch_size", "train.accumulation", "train.lr_scaling",
    "train.reference_batch", "train.grad_clip", "train.seed", "train.num_workers",
    "train.shuffle_buffer",
)  # fmt: skip
# Keys a checkpoint's config may lack (written before they existed), as the code then ran.
ADDED_KEYS = {"ema.warmup": True}


def _math_view(config: dict) -> dict[str, Any]:
    """A config's flat keys as they act: keys added since filled with what the code then did;
    ``train.reference_batch`` dropped where no LR scaling reads it (null and the
    architecture's value mean the same)."""
    flat = {**ADDED_KEYS, **flatten_config(config)}
    if flat.get("train.lr_scaling", "none") == "none":
        flat.pop("train.reference_batch", None)
    elif flat.get("train.reference_batch") is None:
        flat["train.reference_batch"] = REFERENCE_BATCH.get(flat.get("model.arch"))
    return flat


def differing_keys(saved: dict, current: dict, prefixes: tuple[str, ...]) -> list[str]:
    """Flat keys starting with one of ``prefixes`` whose values differ between two configs."""
    old, new = _math_view(saved), _math_view(current)
    return sorted(
        k
        for k in set(old) | set(new)
        if k.startswith(prefixes) and _norm(old.get(k)) != _norm(new.get(k))
    )


def _differences(saved: dict, current: dict, keys: list[str]) -> str:
    old, new = flatten_config(saved), flatten_config(current)
    return "; ".join(f"{k}: checkpoint {old.get(k)!r}, config {new.get(k)!r}" for k in keys)


def check_compatible(saved: dict, current: dict, path: Path) -> None:
    """Refuse a checkpoint whose model or data source differs from the current config."""
    if keys := differing_keys(saved, current, ARCH_KEYS):
        diffs = _differences(saved, current, keys)
        raise CheckpointError(f"{path}: written by an incompatible config ({diffs})")


def ran_precision(state: dict) -> str | None:
    """The precision a checkpoint's steps ran at: its provenance's (the runtime's record); a
    checkpoint written before the runtime was recorded has it as its config's
    ``train.precision``, which the loop then overwrote with the resolved one."""
    ran = state.get("provenance", {}).get("precision")
    return ran or state.get("config", {}).get("train", {}).get("precision")


def check_resumable(
    state: dict, current: dict, global_batch: int, precision: str, path: Path
) -> None:
    """Refuse to resume from ``state`` when a key that changes the training's math differs
    (a resume with a new learning rate would step on the old schedule), or the precision this
    process runs at (the runtime's) is not the one the checkpoint ran at, naming them."""
    keys = differing_keys(state["config"], current, RESUME_KEYS)
    diffs = _differences(state["config"], current, keys)
    if (ran := ran_precision(state)) != precision:
        keys.append("precision")
        setting = current.get("train", {}).get("precision")
        diffs += f"{'; ' if diffs else ''}precision: checkpoint ran {ran!r}, this process runs "
        diffs += f"{precision!r} (train.precision {setting!r} on its device)"
    if state.get("global_batch", global_batch) != global_batch:
        keys.append("global batch")
        diffs += f"{'; ' if diffs else ''}global batch: checkpoint {state['global_batch']}, "
        diffs += f"run {global_batch} (ranks x batch_size x accumulation)"
    if keys:
        raise CheckpointError(
            f"{path}: cannot resume: written by an incompatible config ({diffs}); these keys "
            "change what the next steps compute: restore them, or set train.restart: false to "
            "start over (train.init_from fine-tunes from its weights)"
        )


def selected_weights(state: dict) -> str:
    """The weight set a checkpoint stands for: its run's ``ema.select_best_by`` (raw without
    EMA weights). Evaluation, prediction and fine-tuning all take this one."""
    chosen = state.get("config", {}).get("ema", {}).get("select_best_by", "ema")
    return "ema" if chosen == "ema" and state.get("ema") is not None else "raw"


def _norm(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def rng_state() -> dict[str, Any]:
    """Torch's CPU and CUDA generator states, as tensors (loadable with weights_only)."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""Checkpoints: plain dicts of tensors and primitives, written atomically, loaded safely.

Saved state never carries a ``module.`` (DDP) or ``_orig_mod.`` (torch.compile) prefix, and is
always loaded with ``weights_only=True``: a checkpoint cannot run code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from emb.io import atomic_path

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


def save(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` via a temporary file, fsync and rename."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save`; refuses anything but tensors and plain data."""
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
    """Remove temporary files of checkpoint writes that a killed process left behind."""
    removed = []
    for tmp in Path(folder).glob(".*.pt.tmp-*"):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def check_compatible(saved: dict, current: dict, path: Path) -> None:
    """Refuse a checkpoint whose model or data source differs from the current config."""
    old, new = _flatten(saved), _flatten(current)
    keys = sorted(
        k
        for k in set(old) | set(new)
        if k.startswith(("model.", "data.source")) and _norm(old.get(k)) != _norm(new.get(k))
    )
    if keys:
        diffs = "; ".join(f"{k}: checkpoint {old.get(k)!r}, config {new.get(k)!r}" for k in keys)
        raise CheckpointError(f"{path}: written by an incompatible config ({diffs})")


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

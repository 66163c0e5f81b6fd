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
        raise ValueError(
            f"{path}: not a loadable emb checkpoint ({type(err).__name__}: {err})"
        ) from err
    state["model"] = strip_prefixes(state["model"])
    return state

"""A module's parameters or buffers as views of one flat tensor per dtype.

Why: the EMA and the non-finite guard touch every tensor of the model every step. Per tensor
that is one kernel launch each (DeepLab: 114 BatchNorm buffers, ~300 parameters), which on a
GPU cost 9-10% of a step (issue 39) although the bytes move in well under 0.1 ms. With the
tensors living in one flat tensor per dtype, the EMA's update is one ``lerp_`` and the guard's
save and restore one copy each. The module keeps working as before: each tensor is a view
with its own shape and memory format (channels_last kept), updated in place by the optimizer
and by BatchNorm. Something that later replaces a tensor (``Module.to`` to another device,
``load_state_dict(assign=True)``) breaks the tiling; :class:`FlatPairs` notices and its user
falls back to per-tensor kernels. Applied by :meth:`emb.models.runtime.Runtime.prepare` for
training; :mod:`emb.training.ema` keeps its copy in the same layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def flatten_(module: nn.Module, which: str) -> bool:
    """Move ``module``'s ``"parameters"`` or ``"buffers"`` into one flat tensor per dtype,
    values and strides kept; False (nothing changed) where a tensor is neither contiguous nor
    channels_last, or the tensors sit on several devices."""
    slots = _slots(module, which)
    tensors = list({id(t): t for _, _, t in slots}.values())  # tied tensors once
    if not tensors or len({t.device for t in tensors}) > 1 or not all(map(_dense, tensors)):
        return False
    views: dict[int, torch.Tensor] = {}
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        group = [t for t in tensors if t.dtype == dtype]
        flat = torch.empty(sum(t.numel() for t in group), dtype=dtype, device=group[0].device)
        offset = 0
        for t in group:
            view = flat.as_strided(t.shape, t.stride(), offset)
            view.copy_(t.detach())
            views[id(t)] = view
            offset += t.numel()
    for owner, name, t in slots:
        view = views[id(t)]
        if which == "parameters":
            owner._parameters[name] = nn.Parameter(view, requires_grad=t.requires_grad)
        else:
            owner._buffers[name] = view
    if which == "parameters":  # a tied parameter must stay one object in every owner
        _retie(slots, module)
    return True


def flats_of(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """The flat tensors that ``tensors`` tile exactly (each element once, nothing else), one
    per dtype, or None where they do not (then update them tensor by tensor)."""
    if not tensors:
        return None
    flats = []
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        group = [t for t in tensors if t.dtype == dtype]
        storage = group[0].untyped_storage()
        numel = storage.nbytes() // group[0].element_size()
        if len({t.untyped_storage().data_ptr() for t in group}) != 1:
            return None
        if sum(t.numel() for t in group) != numel or not all(map(_dense, group)):
            return None
        flats.append(torch.empty(0, dtype=dtype, device=group[0].device).set_(storage, 0, (numel,)))
    return flats


class FlatPairs:
    """Two tensor lists of one layout (a model and its EMA copy) as pairs of flat tensors,
    checked again each call: the tensors' addresses must be those first seen."""

    def __init__(self, targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
        self._seen = _addresses(targets, sources)
        self.pairs = _pair_flats(targets, sources)

    def get(
        self, targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]
    ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The flat pairs, or None where the lists no longer tile them as first seen."""
        if self.pairs is None or _addresses(targets, sources) != self._seen:
            return None
        return self.pairs


def _pair_flats(
    targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]
) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    a, b = flats_of(targets), flats_of(sources)
    if a is None or b is None or len(a) != len(b):
        return None
    if any(
        (x.dtype, x.numel(), x.device) != (y.dtype, y.numel(), y.device)
        for x, y in zip(a, b, strict=True)
    ):
        return None
    for t, s in zip(targets, sources, strict=True):  # the same element at the same offset
        if (t.shape, t.stride(), t.storage_offset()) != (s.shape, s.stride(), s.storage_offset()):
            return None
    return list(zip(a, b, strict=True))


def _addresses(*lists: Sequence[torch.Tensor]) -> tuple:
    return tuple(tuple(t.data_ptr() for t in tensors) for tensors in lists)


def _dense(t: torch.Tensor) -> bool:
    """Dense and non-overlapping in a format a flat view can reproduce."""
    return t.is_contiguous() or (
        t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
    )


def _slots(module: nn.Module, which: str) -> list[tuple[nn.Module, str, torch.Tensor]]:
    table = "_parameters" if which == "parameters" else "_buffers"
    return [
        (owner, name, t)
        for owner in module.modules()
        for name, t in getattr(owner, table).items()
        if t is not None
    ]


def _retie(slots: list[tuple[nn.Module, str, torch.Tensor]], module: nn.Module) -> None:
    first: dict[int, nn.Parameter] = {}
    for owner, name, t in slots:
        first.setdefault(id(t), owner._parameters[name])
        owner._parameters[name] = first[id(t)]

"""Exponential moving average of a model: parameters averaged, buffers copied.

Copying buffers matters: an EMA that averaged parameters but kept its initial BatchNorm
running statistics validated as a broken model in the seeds' runs. With ``warmup`` (the
schema's default) the decay at update n is ``min(decay, (1 + n) / (10 + n))`` so short runs are not
dominated by the initial weights: 0.99 after ~890 updates, 0.999 after ~9k, and 0.9999 only
after ~90k. The seeds' own EMA uses the fixed decay from the first update (``warmup=False``).
Where the model's parameters and buffers live in flat tensors (:mod:`emb.models.flat_tensors`,
as :func:`emb.training.loop.build_trainer` makes them), the EMA's copy is flattened the same way
and an update is one ``lerp_`` over the parameters and one ``copy_`` of the buffers per dtype:
two kernels instead of several hundred launches (issue 39). Elsewhere (a compiled model) it is
one ``_foreach_lerp_`` and one ``_foreach_copy_`` over all tensors, with the same values.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from emb.models.flat_tensors import FlatPairs, flatten_
from emb.training.checkpoint_file import unwrap


class ModelEma:
    """A frozen copy of a model that follows it by ``shadow = d * shadow + (1 - d) * model``."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool) -> None:
        source = unwrap(model)
        self.module = copy.deepcopy(source).eval()
        self.module.requires_grad_(False)
        flatten_(self.module, "parameters")
        flatten_(self.module, "buffers")
        self.decay, self.warmup = decay, warmup
        self._params = FlatPairs(list(self.module.parameters()), list(source.parameters()))
        self._buffers = FlatPairs(list(self.module.buffers()), list(source.buffers()))
        device = next(self.module.parameters()).device
        self._updates = torch.zeros((), dtype=torch.float64, device=device)  # counted on device

    @property
    def updates(self) -> int:
        """Updates applied so far (a host read)."""
        return int(self._updates)

    @updates.setter
    def updates(self, value: int) -> None:
        self._updates.fill_(value)

    def current_decay(self) -> float:
        """The decay of the next update: warmed up, or the fixed ``decay`` (a host read)."""
        return float(self._decay())

    def _decay(self) -> torch.Tensor:
        n = self._updates
        if not self.warmup:
            return torch.full_like(n, self.decay)
        return torch.clamp((1 + n) / (10 + n), max=self.decay)

    @torch.no_grad()
    def update(self, model: nn.Module, applied: torch.Tensor | None = None) -> None:
        """Call after each optimizer step; where ``applied`` (a 0-d bool on the device) is
        false the weight is 0 and nothing changes (no host read either way)."""
        weight = 1.0 - self._decay()
        if applied is not None:
            weight = torch.where(applied, weight, 0.0)
        source = unwrap(model)
        shadows, values = _pairs(self.module.parameters(), source.parameters())
        flat = self._params.get(shadows, values)
        if flat is not None:
            for shadow, value in flat:
                shadow.lerp_(value, weight.to(shadow.dtype))
        elif shadows:
            _lerp_(shadows, values, weight.to(shadows[0].dtype))  # no_grad: no detach
        self.update_buffers(source)
        self._updates += 1 if applied is None else applied.to(torch.float64)

    @torch.no_grad()
    def update_buffers(self, model: nn.Module) -> None:
        """Copy buffers only: after BatchNorm statistics were averaged over ranks."""
        shadows, values = _pairs(self.module.buffers(), unwrap(model).buffers())
        flat = self._buffers.get(shadows, values)
        if flat is not None:
            torch._foreach_copy_(*map(list, zip(*flat, strict=True)))
        elif shadows:
            torch._foreach_copy_(shadows, values)

    def state_dict(self) -> dict[str, Any]:
        """The averaged weights and the update count, under checkpoint keys."""
        return {"ema": self.module.state_dict(), "ema_updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["ema"])
        self.updates = int(state["ema_updates"])


def _lerp_(shadows: list[torch.Tensor], values: list[torch.Tensor], weight: torch.Tensor) -> None:
    """``shadows += weight * (values - shadows)`` with a device weight, fused where PyTorch
    takes a 0-d tensor weight (2.13 does), three fused ops where it does not."""
    try:
        torch._foreach_lerp_(shadows, values, weight)
    except (TypeError, RuntimeError):
        diff = torch._foreach_sub(values, shadows)
        torch._foreach_mul_(diff, weight)
        torch._foreach_add_(shadows, diff)


def _pairs(
    shadows: Iterator[torch.Tensor], values: Iterator[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two equally long tensor lists (a model that is not the EMA's copy is refused)."""
    pairs = list(zip(shadows, values, strict=True))
    return [s for s, _ in pairs], [v for _, v in pairs]

"""Test-only launcher: inject one fault into the real training stage, then run its ``main``.

Production code carries no test hooks: this script patches from the outside and is launched in
place of ``-m emb.training.train``
(``torchrun [...] tests/reliability/fault_launcher.py --config X``).
``EMB_FAULT`` says what to inject:

- ``slow_write:BYTES_PER_S``: checkpoint bytes trickle out at that rate, and the checksum
  sidecar writes around the rename wait 0.1 s, so a SIGKILL can land anywhere in a save.
- ``nan_tile:RANK:CALL`` / ``inf_loss:RANK:CALL``: on rank RANK, the CALL-th optimizer step
  (1-based) gets a NaN in one input tile (after de-quantization) or a loss of +Inf.

With ``nan_tile``/``inf_loss`` every rank appends one JSON line per step to
``RUN_DIR/ranks/steps{rank}.jsonl``: applied or not, and sha256 digests of weights, buffers, EMA
and optimizer state before and after the step.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from emb.training import checkpoint_file, train
from emb.training.trainer import Trainer


def slow_writes(bytes_per_s: float) -> None:
    piece = 16 * 1024
    write, write_checksums = checkpoint_file.HashingWriter.write, checkpoint_file._write_checksums

    def slow_write(self, data) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), piece):
            part = view[start : start + piece]
            write(self, part)
            time.sleep(len(part) / bytes_per_s)
        return len(view)

    def slow_checksums(path, digests) -> None:
        time.sleep(0.1)
        write_checksums(path, digests)

    checkpoint_file.HashingWriter.write = slow_write
    checkpoint_file._write_checksums = slow_checksums


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def snapshot(trainer: Trainer) -> dict[str, str]:
    model = checkpoint_file.unwrap(trainer.model)
    opt = trainer.optimizer.state_dict()["state"]
    return {
        "weights": digest(model.parameters()),
        "buffers": digest(model.buffers()),
        "ema": digest(trainer.ema.module.state_dict().values()) if trainer.ema else "",
        "optimizer": digest(t for s in opt.values() for t in s.values() if torch.is_tensor(t)),
    }


def inject_nonfinite(kind: str, rank: int, call: int, log: Path) -> None:
    here = int(os.environ.get("RANK", 0))
    step = Trainer.train_step

    def train_step(self: Trainer, micro_batches):
        self._calls = getattr(self, "_calls", 0) + 1
        hit = here == rank and self._calls == call
        before = snapshot(self)
        dequantize, loss_fn = self.dequantize, self.loss_fn
        if hit and kind == "nan_tile":

            def poisoned(batch):
                x, y = dequantize(batch)
                x = x.clone()
                x[0] = float("nan")
                return x, y

            self.dequantize = poisoned
        if hit and kind == "inf_loss":

            def inf_loss(logits, targets):
                loss, parts = loss_fn(logits, targets)
                return loss * float("inf"), parts

            self.loss_fn = inf_loss
        try:
            result = step(self, micro_batches)
        finally:
            self.dequantize, self.loss_fn = dequantize, loss_fn
        record = {"call": self._calls, "injected": hit, "applied": result.applied,
                  "grad_norm": str(float(result.grad_norm)), "skipped": self.skipped,
                  "before": before, "after": snapshot(self)}  # fmt: skip
        with open(log, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        return result

    Trainer.train_step = train_step


def main() -> None:
    argv = sys.argv[1:]
    run_dir = Path(argv[argv.index("--config") + 1]).parent
    kind, *args = os.environ["EMB_FAULT"].split(":")
    if kind == "slow_write":
        slow_writes(float(args[0]))
    elif kind in ("nan_tile", "inf_loss"):
        log = run_dir / "ranks" / f"steps{os.environ.get('RANK', 0)}.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        inject_nonfinite(kind, int(args[0]), int(args[1]), log)
    else:
        raise SystemExit(f"EMB_FAULT={os.environ['EMB_FAULT']!r}: unknown fault")
    train.main(argv)


if __name__ == "__main__":
    main()

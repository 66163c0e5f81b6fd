"""Stopping early on purpose: a signal (SIGUSR1/SIGTERM from SLURM) or a wall-clock deadline.

Handlers only set a flag: nothing is written inside a signal handler. Every ``check_every``
steps (and before each validation) the ranks agree (:func:`emb.training.distributed.any_rank`),
so every rank saves at the same step and exits with :data:`EXIT_STOPPED`. Agreeing is a host
read, which a GPU step must not wait for each time; a signal is answered within
``check_every`` steps, and the deadline is projected over them.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped with a checkpoint, run the job again to resume
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopRequest:
    """Why this process wants to stop, if it does: a caught signal or a deadline ahead.

    ``deadline`` is a ``time.time()`` value (or None); steps are not started when the mean
    step time so far says the ``check_every`` up to the next check would end later than
    ``deadline - margin_s``, counting the
    validation that follows it where one does: the longest validation timed so far, or, before
    the first, ``validation_steps`` mean steps (set from the validation split's size).
    """

    def __init__(
        self, deadline: float | None = None, margin_s: float = 120.0, check_every: int = 20
    ) -> None:
        self.deadline, self.margin_s, self.check_every = deadline, margin_s, check_every
        self.signal: int | None = None
        self._steps, self._seconds = 0, 0.0
        self.validation_steps = 0.0
        self._validation_s: float | None = None

    def install(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal = signum

    def record_step(self, seconds: float) -> None:
        self._steps += 1
        self._seconds += seconds

    def record_validation(self, seconds: float) -> None:
        self._validation_s = max(seconds, self._validation_s or 0.0)

    def reason(self, now: float | None = None, validation: bool = False) -> str | None:
        """A short reason to stop before the next step (and the validation that follows it,
        when ``validation``), or None to go on."""
        if self.signal is not None:
            return f"signal {signal.Signals(self.signal).name}"
        if self.deadline is None:
            return None
        step = self._seconds / self._steps if self._steps else 0.0
        val = 0.0
        if validation:
            timed = self._validation_s
            val = timed if timed is not None else self.validation_steps * step
        now = time.time() if now is None else now
        if now + self.check_every * step + val > self.deadline - self.margin_s:
            left = self.deadline - now
            then = f", validation {val:.1f} s" if validation else ""
            return (
                f"deadline in {left:.0f} s ({self.check_every} steps of {step:.2f} s to the next "
                f"check{then}, margin {self.margin_s:.0f} s)"
            )
        return None

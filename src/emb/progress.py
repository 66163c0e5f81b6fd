"""Progress of long work as log lines: count done, rate and ETA, at least every ``every_s``
seconds or every ``every_fraction`` of the total, whichever comes first.

Plain timestamped lines through :mod:`logging` (a SLURM or Snakemake log shows an hour-long
shard build moving), one call per unit of work::

    progress = Progress(len(tiles), unit="tiles", what=f"{source}/{region} shards")
    for tile in tiles:
        ...
        progress.advance()
    progress.done()
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

EVERY_S = 30.0  # seconds between lines at most (the stage CLIs take EMB_PROGRESS_EVERY_S)
EVERY_FRACTION = 0.05
_settings = {"every_s": EVERY_S}


def set_interval(every_s: float) -> None:
    """Seconds between progress lines for every :class:`Progress` made afterwards (CLI glue)."""
    _settings["every_s"] = float(every_s)


class Progress:
    """Counts units of work done and logs how far, how fast and how long still."""

    def __init__(
        self,
        total: int,
        unit: str = "items",
        what: str = "",
        logger: logging.Logger | None = None,
        every_s: float | None = None,
        every_fraction: float = EVERY_FRACTION,
    ) -> None:
        self.total, self.unit, self.what = max(int(total), 0), unit, what
        self.log = logger or logging.getLogger("emb.progress")
        self.every_s = _settings["every_s"] if every_s is None else every_s
        self.step = max(1, int(self.total * every_fraction)) if self.total else 1
        self.count = 0
        self.started = self._last_time = time.monotonic()
        self._last_count = 0
        self._closed = False
        self._line("started")

    def advance(self, n: int = 1) -> None:
        """``n`` more units done; logs when enough time or work has passed since the last line."""
        self.count += n
        now = time.monotonic()
        if self.count >= self.total:  # the closing line says it
            return
        if now - self._last_time >= self.every_s or self.count - self._last_count >= self.step:
            self._line()
            self._last_time, self._last_count = now, self.count

    def done(self) -> None:
        """The closing line (once): everything counted, total time."""
        if not self._closed:
            self._closed = True
            self._line("done")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type | None, *_: object) -> None:
        if kind is None:
            self.done()

    def summary(self) -> str:
        """``120/400 tiles (30%), 12.3 tiles/s, ETA 0:00:23``."""
        elapsed = time.monotonic() - self.started
        rate = self.count / elapsed if elapsed > 0 else 0.0
        text = f"{self.count}/{self.total} {self.unit}"
        if self.total:
            text += f" ({self.count / self.total:.0%})"
        text += f", {rate:.0f} {self.unit}/s" if rate >= 100 else f", {rate:.3g} {self.unit}/s"
        left = self.total - self.count
        if left > 0 and rate > 0:
            text += f", ETA {timedelta(seconds=round(left / rate))}"
        elif left <= 0:
            text += f", took {timedelta(seconds=round(elapsed))}"
        return text

    def _line(self, note: str = "") -> None:
        prefix = f"{self.what}: " if self.what else ""
        suffix = f" ({note})" if note and note != "started" else ""
        if note == "started":
            self.log.info("%s%d %s to do", prefix, self.total, self.unit)
        else:
            self.log.info("%s%s%s", prefix, self.summary(), suffix)

"""torchrun's stderr passed on as it comes, with torchrun's own final traceback held back.

torchrun ends a failed rendezvous or a failed worker with a traceback through its own frames
(``RendezvousTimeoutError``, ``ChildFailedError``, chained to their causes), and where the
launcher's line that follows names the cause (a node lost, or never come), that traceback only
buries it. So the launcher reads torchrun's stderr through a pipe (its workers', which inherit
it, too) and passes every line on at once, except:

- a traceback, held until it is complete (its chain of causes included, :data:`CHAIN_S` at
  most): a worker's then passes unchanged; torchrun's uncaught one (its frames run through
  ``torch/distributed/run.py``, where no other traceback runs) is held, with what follows it,
  until torchrun has ended. :meth:`TorchrunOutput.release` then writes it as it was, or, when
  the launcher's own line explains the failure, as one line (``torchrun:
  RendezvousTimeoutError``);
- the C++ stack dumps that torch appends to its own log lines (``Exception raised from ...``,
  ``frame #0: c10::Error::Error(...)``): dropped; the ``[E...]``/``[W...]`` line above each says
  what happened.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from typing import BinaryIO

TRACEBACK = b"Traceback (most recent call last):"
CHAIN = (b"The above exception was the direct cause of the following exception:",
         b"During handling of the above exception, another exception occurred:")  # fmt: skip
AGENT_FRAME = b"torch/distributed/run.py"  # torchrun's main: only in its uncaught traceback
CPP_LOG = re.compile(rb"^\[[EWIF]\d{4} ")  # torch's C++ log line ([E1128 09:53:02.66 ...])
CPP_DUMP = b"Exception raised from "
CHAIN_S = 5.0  # a traceback is printed in one go: one still incomplete after this passes on
TICK_S = 0.5


class TorchrunOutput:
    """Copies torchrun's stderr to ``sink`` in a thread (:meth:`read`), holding back
    torchrun's own traceback until :meth:`release`."""

    def __init__(self, sink: BinaryIO):
        self._sink = sink
        self._lock = threading.Lock()
        self._chain: list[bytes] = []  # a traceback (and its causes) not yet complete
        self._chain_since = 0.0
        self._in_frames = False  # inside a traceback's frames (else after its exception line)
        self._held: list[bytes] = []  # torchrun's traceback and whatever came after it
        self._previous = b""
        self._in_dump = False
        self._released = False
        self._thread: threading.Thread | None = None

    def read(self, source: BinaryIO) -> None:
        """Start copying ``source`` until its end (torchrun and every worker gone)."""
        self._thread = threading.Thread(
            target=self._copy, args=(source,), name="emb-torchrun-output", daemon=True
        )
        self._thread.start()

    def release(self, explained: bool, wait_s: float = 10.0) -> None:
        """Write what was held: torchrun's traceback as it was, or, when ``explained`` (the
        launcher's next line says why torchrun failed), its exception in one line."""
        if self._thread is not None:
            self._thread.join(wait_s)  # a process that outlived torchrun may hold the pipe
        with self._lock:
            self._released = True
            held, self._held = self._held + self._chain, []
            self._chain = []
            if explained and any(AGENT_FRAME in line for line in held):
                held = [summary(held)]
            self._write(b"".join(held))

    def _copy(self, source: BinaryIO) -> None:
        partial, fd = b"", source.fileno()
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], TICK_S)
                chunk = os.read(fd, 65536) if ready else None
                if chunk == b"":
                    break
                with self._lock:
                    if chunk:
                        *lines, partial = (partial + chunk).split(b"\n")
                        for line in lines:
                            self._take(line + b"\n")
                    self._tick()
        except (OSError, ValueError):  # the pipe closed under us: nothing more to copy
            pass
        source.close()
        with self._lock:
            if partial:
                self._take(partial)
            self._end_chain()

    def _take(self, line: bytes) -> None:
        if not self._drop_dump(line):
            self._route(line)

    def _route(self, line: bytes) -> None:
        if self._released:
            self._write(line)
        elif self._held:
            self._held.append(line)
        elif self._chain:
            self._extend_chain(line)
        elif line.rstrip() == TRACEBACK:
            self._chain, self._chain_since, self._in_frames = [line], time.monotonic(), True
        else:
            self._write(line)

    def _extend_chain(self, line: bytes) -> None:
        """Add ``line`` to the traceback being read, or end it there (and pass ``line`` on)."""
        text = line.rstrip()
        if self._in_frames:
            self._chain.append(line)
            if text and not line[:1].isspace():  # its exception line
                self._in_frames = False
        elif not text or text in CHAIN:  # between the tracebacks of a chain
            self._chain.append(line)
        elif text == TRACEBACK:
            self._chain.append(line)
            self._in_frames = True
        else:  # the traceback is complete
            self._end_chain()
            self._route(line)

    def _end_chain(self) -> None:
        """The traceback read is complete: torchrun's last words are held with all that
        follows them, any other passes on."""
        chain, self._chain = self._chain, []
        if any(AGENT_FRAME in line for line in chain):
            self._held = chain
        else:
            self._write(b"".join(chain))

    def _tick(self) -> None:
        """A traceback is printed in one go: one that ends or pauses for :data:`CHAIN_S` is
        complete."""
        if self._chain and time.monotonic() - self._chain_since > CHAIN_S:
            self._end_chain()

    def _drop_dump(self, line: bytes) -> bool:
        """Whether ``line`` belongs to a C++ stack dump under a torch log line (to the blank
        line that ends it)."""
        if self._in_dump:
            self._in_dump = bool(line.strip())
            return True
        starts = line.startswith(CPP_DUMP) and bool(CPP_LOG.match(self._previous))
        self._previous = line
        self._in_dump = starts
        return starts

    def _write(self, data: bytes) -> None:
        if not data:
            return
        try:
            self._sink.write(data)
            self._sink.flush()
        except (OSError, ValueError):  # the reader went away: keep draining, never block
            pass


def summary(held: list[bytes]) -> bytes:
    """``torchrun: NAME: MESSAGE`` from the last exception of the traceback (chain) that
    ``held`` starts with, the module path dropped."""
    exception, in_frames = b"", False
    for line in held:
        text = line.rstrip()
        if text == TRACEBACK:
            in_frames = True
        elif in_frames and text and not line[:1].isspace():
            exception, in_frames = text, False
        elif not in_frames and text and text not in CHAIN:
            break  # past the traceback: its message's further lines, or other output
    name, _, message = exception.decode("utf-8", "replace").partition(":")
    text = f"torchrun: {name.rsplit('.', 1)[-1] or 'failed'}"
    if message.strip():
        text += f": {' '.join(message.split())[:300]}"
    return (text + "\n").encode()

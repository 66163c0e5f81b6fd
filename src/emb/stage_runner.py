"""What every stage's ``main()`` shares: timestamped log lines, and known errors as one line
and an exit code per kind (docs/design.md, "Exit codes").

A stage adopts it with one decorator::

    @stage_runner.stage
    def main(argv: list[str] | None = None) -> None:
        args = parser.parse_args(argv)
        log.info("...")  # log = logging.getLogger(__name__)
        do_the_work(args)  # raises the project's errors where bad values enter

Errors are turned into exit codes here and only here:

====  ============================================================================
0     done
1     a bug: any other exception, traceback kept
2     bad input or config: a ``ValueError`` subclass defined in ``emb`` (``ConfigError``,
      ``TilingError``, ``ShardError``, ...), whose message names file, key, expected and found;
      argparse usage errors
66    an input is missing or unreadable (``FileNotFoundError``, a file we may not read, a
      directory where a file was expected, a file GDAL cannot open)
73    an output cannot be created (read-only file system, no write permission)
74    disk full (ENOSPC, EDQUOT); nothing half-written is left under an output's name
130   interrupted (SIGINT), 143 terminated (SIGTERM): staged outputs removed, old ones intact
====  ============================================================================

``emb.training.train`` adds 3 (diverged) and 75 (stopped with a checkpoint), and keeps 2 for
any ``ValueError``.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from emb import progress
from emb.io import is_disk_full

EXIT_BUG, EXIT_INPUT, EXIT_NO_INPUT, EXIT_CANT_CREATE, EXIT_DISK_FULL = 1, 2, 66, 73, 74
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
F = TypeVar("F", bound=Callable[..., object])
log = logging.getLogger("emb")


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwinds the stage so its ``finally`` blocks clean up.

    A ``BaseException``, like ``KeyboardInterrupt``: ``except Exception`` does not swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StageExit(SystemExit):
    """A stage's end on a known error: ``code`` is the exit code, ``str()`` the message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


class _CurrentStderr(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (pytest swaps it per test)."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "__main__":  # a stage run as ``python -m emb.x.y``: say emb.x.y
            record.name = module_name("__main__")
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never end the stage
            self.handleError(record)


def setup_logging(level: int = logging.INFO) -> None:
    """Timestamped lines on stderr (``2026-11-24 15:20:01 INFO emb.prep.shards: ...``): the
    same plain lines on a terminal and in a SLURM or Snakemake log. Python warnings go there
    too. Calling it again changes nothing."""
    root = logging.getLogger()
    if not any(isinstance(h, _CurrentStderr) for h in root.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
        root.addHandler(handler)
        if root.level == logging.NOTSET or root.level > logging.WARNING:
            root.setLevel(logging.WARNING)  # other libraries: warnings and errors only
    log.setLevel(level)
    logging.getLogger("__main__").setLevel(level)  # a stage's own logger under ``python -m``
    logging.captureWarnings(True)
    _copy_errors_to(os.environ.get(ERROR_FILE_ENV))


ERROR_FILE_ENV = "EMB_ERROR_FILE"  # set by emb.cluster.launch: a retry repeats why it failed


def _copy_errors_to(path: str | None) -> None:
    """ERROR lines also appended to ``path``: Snakemake drops a failed attempt's log before a
    retry, and the retry (emb.cluster.retries) must still say why the first attempt failed."""
    root = logging.getLogger()
    if not path or any(getattr(h, "baseFilename", None) == path for h in root.handlers):
        return
    try:
        handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    except OSError:
        return
    handler.setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    root.addHandler(handler)


def exit_code(err: BaseException) -> int:
    """The exit code of a known error (see the module docstring); ``EXIT_BUG`` otherwise."""
    if isinstance(err, Interrupted):
        return 128 + err.signum
    if isinstance(err, KeyboardInterrupt):
        return 128 + signal.SIGINT
    if isinstance(err, ValueError) and module_name(type(err).__module__).startswith("emb."):
        return EXIT_INPUT
    if not isinstance(err, OSError):
        return EXIT_BUG
    if is_disk_full(err):
        return EXIT_DISK_FULL
    if err.errno == errno.EROFS:
        return EXIT_CANT_CREATE
    if isinstance(err, PermissionError):
        name = err.filename
        exists = name is not None and os.path.isfile(name)
        return EXIT_NO_INPUT if exists and not os.access(name, os.R_OK) else EXIT_CANT_CREATE
    if isinstance(err, FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return EXIT_NO_INPUT
    if type(err).__module__.startswith("rasterio"):  # RasterioIOError: GDAL cannot open it
        return EXIT_NO_INPUT
    return EXIT_BUG


def message(err: BaseException) -> str:
    """One line: the error's own message, with the file an ``OSError`` names."""
    if isinstance(err, Interrupted | KeyboardInterrupt):
        signame = err.args[0] if isinstance(err, Interrupted) else "SIGINT"
        return f"interrupted by {signame}: partial outputs removed, earlier outputs intact"
    if isinstance(err, OSError) and not type(err).__module__.startswith("rasterio"):
        text = err.strerror or str(err)
        if is_disk_full(err):
            text = f"disk full ({text}); free space and run again"
        where = err.filename if err.filename is not None else "(no file named)"
        if err.filename2 is not None:
            where = f"{where} -> {err.filename2}"
        return f"{where}: {text}"
    return " ".join(str(err).split()) or type(err).__name__


@contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """SIGTERM raises :class:`Interrupted` in the main thread for the time of the block (SIGINT
    already raises ``KeyboardInterrupt``), so cleanup in ``finally`` runs; handlers a stage
    installs itself (training's stop flag) take over from this one."""
    if threading_main():
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)
    else:
        yield


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT wait until the block is done: a commit (renames) is never cut in
    half. A signal that came meanwhile is acted on at the end of the block."""
    if not threading_main():
        yield
        return
    held = (signal.SIGTERM, signal.SIGINT)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def threading_main() -> bool:
    """Signal handlers can only be set, and signals only masked for, the main thread."""
    return threading.current_thread() is threading.main_thread()


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def stage(main: F) -> F:
    """Wrap a stage's ``main``: logging set up, known errors as one ``ERROR`` line and their
    exit code (:class:`StageExit`), bugs with their traceback."""

    @functools.wraps(main)
    def wrapped(*args: object, **kwargs: object) -> object:
        setup_logging()
        _progress_interval(os.environ.get("EMB_PROGRESS_EVERY_S"))
        name = module_name(main.__module__)
        started = time.monotonic()
        try:
            with signals_as_exceptions():
                result = main(*args, **kwargs)
        except (Exception, Interrupted, KeyboardInterrupt) as err:
            code = exit_code(err)
            if code == EXIT_BUG:
                raise
            text = message(err)
            logging.getLogger(name).error("%s", text)
            raise StageExit(code, text) from err
        logging.getLogger(name).debug("done in %.1f s", time.monotonic() - started)
        return result

    return wrapped  # type: ignore[return-value]


def _progress_interval(value: str | None) -> None:
    """``EMB_PROGRESS_EVERY_S``: seconds between progress lines (default 30)."""
    if value:
        try:
            progress.set_interval(float(value))
        except ValueError:
            log.warning("EMB_PROGRESS_EVERY_S=%r is not a number of seconds: ignored", value)


def module_name(name: str) -> str:
    """``emb.prep.shards`` for ``__main__`` when run as ``python -m emb.prep.shards``."""
    if name != "__main__":
        return name
    spec = getattr(sys.modules.get(name), "__spec__", None)
    return spec.name if spec is not None else name

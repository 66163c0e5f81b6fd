"""Work in parts across the machine's cores, each part in a forked process: where most of a
job's time is code that holds the GIL (rasterio's opens, PROJ building a CRS, GEOS burning a
polygon), threads overlap little of it and processes overlap all of it. A part's function
reaches the workers by fork, not by pickling (a closure over the job's data will do); its result
and its error come back pickled. Off Linux, on one core, or for one part, the parts run here in
turn, with the same results."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.connection import Connection
from typing import TypeVar

import numpy as np

R = TypeVar("R")
T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")

_PART: Callable[[int], object] | None = None  # the job of the pool being run (inherited by fork)


def cores(most: int) -> int:
    """The cores this process may run on (the machine's where the OS cannot say), at most
    ``most``."""
    found = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(found or 1, most))


def fork_allowed() -> bool:
    """Linux only: macOS offers fork, but a forked child of a process that has loaded its
    system frameworks (as GDAL's and PROJ's libraries may) can crash."""
    return sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


def in_parts(part: Callable[[int], R], parts: int, workers: int) -> list[R]:
    """``[part(0), ..., part(parts - 1)]``, up to ``workers`` parts at once in forked
    processes (for two parts or more, two workers or more, where fork is allowed; a part that
    itself calls this runs its parts in turn), else in this process in turn. The error of the
    lowest part that fails is raised, as running them in turn would raise it (sent back whole
    where it pickles, else as a RuntimeError with its type and text; the worker's traceback as a
    note); the parts not started by then are not run."""
    global _PART
    workers = min(workers, parts)
    if workers < 2 or not fork_allowed() or _PART is not None:
        return [part(i) for i in range(parts)]
    _PART = part
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            found = []
            for ok, value in pool.map(_run_part, range(parts)):
                if not ok:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise value
                found.append(value)
            return found
    finally:
        _PART = None


def two_rounds(
    first: Callable[[int], A], between: Callable[[list[A]], B], second: Callable[[int, B], C],
    parts: int,
) -> list[C]:  # fmt: skip
    """``[second(i, b) for i in range(parts)]`` where ``b = between([first(0), ...])``: each
    part in a forked process of its own through both rounds, so that what ``first(i)`` leaves
    in that process's memory (a closure's dict) is there for ``second(i, b)`` and only what the
    rounds return travels; ``between`` runs here. Where fork is not allowed, for one part, or
    inside a part, all in this process in turn (the same results). An error: the lowest
    failing part's of the round is raised (as :func:`in_parts`), the workers stopped."""
    global _PART
    if parts < 2 or not fork_allowed() or _PART is not None:
        b = between([first(i) for i in range(parts)])
        return [second(i, b) for i in range(parts)]
    _PART = first  # marks the workers' memory: a part's own calls run in turn
    context, workers = multiprocessing.get_context("fork"), []
    try:
        for i in range(parts):
            here, there = context.Pipe()
            ours = [pipe for _, pipe in workers] + [here]  # the worker closes its copies
            worker = context.Process(target=_two_rounds_of, args=(first, second, i, there, ours),
                                     daemon=True, name=f"emb-part-{i}")  # fmt: skip
            worker.start()
            there.close()  # this process's copy: a dead worker's pipe then ends (EOFError)
            workers.append((worker, here))
        b = between(_answers(workers, "first"))
        for _, pipe in workers:
            pipe.send(b)
        return _answers(workers, "second")
    finally:
        _PART = None
        for worker, pipe in workers:
            pipe.close()
            worker.join(timeout=1)
            if worker.is_alive():
                worker.kill()
                worker.join()


def _two_rounds_of(
    first: Callable[[int], A], second: Callable[[int, B], C], index: int, pipe: Connection,
    ours: list[Connection],
) -> None:  # fmt: skip
    """A worker of :func:`two_rounds`: its part's first round, then, given ``between``'s
    result, its second; each answer (ok, value) down ``pipe``. ``ours``: the caller's ends of
    the pipes, copied by the fork, closed here first, so that a pipe ends (EOFError) for its
    worker when the caller closes it, whatever other workers hold."""
    for end in ours:
        end.close()
    outcome = _outcome(first, index)
    pipe.send(outcome)
    if outcome[0]:
        try:
            b = pipe.recv()
        except EOFError:  # the caller stopped (another part's error)
            return
        pipe.send(_outcome(lambda i: second(i, b), index))
    pipe.close()


def _answers(workers: list, round_name: str) -> list:
    """Each worker's answer of a round, in part order; the lowest error raised, a worker that
    ended without one named."""
    found = []
    for i, (worker, pipe) in enumerate(workers):
        try:
            ok, value = pipe.recv()
        except EOFError:
            worker.join()
            raise RuntimeError(
                f"worker process {worker.pid} (part {i}) ended in the {round_name} round without "
                f"an answer, exit code {worker.exitcode} (killed, e.g. out of memory?)"
            ) from None
        if not ok:
            raise value
        found.append(value)
    return found


def _run_part(index: int) -> tuple[bool, object]:
    """(True, result) or (False, the error made sendable) of the pool's part ``index``."""
    return _outcome(_PART, index)


def _outcome(part: Callable[[int], R], index: int) -> tuple[bool, object]:
    """(True, part(index)) or (False, its error made sendable, the worker's traceback a note)."""
    try:
        return True, part(index)
    except Exception as error:  # noqa: BLE001 - every error goes back to the caller, whole
        error.add_note(f"in worker process {os.getpid()}, part {index}:\n"
                       + "".join(traceback.format_tb(error.__traceback__)))  # fmt: skip
        return False, sendable(error)


def sendable(value: object) -> object:
    """An exception that pickles back as itself, else a RuntimeError naming it (an exception
    class whose __init__ takes other arguments than its args fails to unpickle); any other
    value as it is."""
    if not isinstance(value, BaseException):
        return value
    try:
        back = pickle.loads(pickle.dumps(value))
    except Exception:  # noqa: BLE001 - any failure to round-trip means: send text instead
        return RuntimeError(f"{type(value).__name__}: {value}")
    if type(back) is type(value) and str(back) == str(value):
        return value
    return RuntimeError(f"{type(value).__name__}: {value}")


def forked_workers(threads: int, parts: int) -> int:
    """The processes :func:`in_parts` runs ``parts`` parts in, given ``threads`` cores to use:
    as many as the cores this process may run on allow, at most one a part; 1 (the parts in
    this process, in turn) where fork is not allowed."""
    workers = min(cores(threads), parts)
    return workers if workers >= 2 and fork_allowed() else 1


def shares(
    items: Sequence[T], parts: int, weights: Sequence[float] | None = None
) -> list[Sequence[T]]:
    """``items`` in ``parts`` (at most one an item) contiguous runs, in order, never empty: of
    near-equal length, or given ``weights`` (e.g. file sizes: the work an item takes) of
    near-equal weight."""
    parts = max(1, min(parts, len(items)))
    if weights is None or not len(items):
        bounds = [len(items) * i // parts for i in range(parts + 1)]
    else:
        reach = np.cumsum(np.asarray(weights, np.float64))
        cuts = np.searchsorted(reach, reach[-1] * np.arange(1, parts) / parts, side="right")
        bounds = [0]
        for k, cut in enumerate(cuts.tolist(), start=1):  # each part one item at least
            bounds.append(min(max(cut, bounds[-1] + 1), len(items) - (parts - k)))
        bounds.append(len(items))
    return [items[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

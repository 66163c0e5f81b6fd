"""torchrun's stderr through the launcher: every line passed on at once, torchrun's own final
traceback held until the launcher knows whether its line explains the failure.

The texts are what torch 2.13's torchrun and a worker print (paths shortened)."""

from __future__ import annotations

import io
import os
import time

import pytest

from emb.cluster import torchrun_output
from emb.cluster.torchrun_output import TorchrunOutput

WORKER_TRACEBACK = b"""\
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/repo/src/emb/training/train.py", line 84, in train
    dist.init_process_group(
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81, in wrapper
    return func(*args, **kwargs)
RuntimeError: Connection closed by peer [127.0.0.1]:29500
"""
AGENT_TRACEBACK = b"""\
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/dynamic_rendezvous.py", line 680, in run
    raise RendezvousTimeoutError
torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError
"""  # noqa: E501 - torchrun's own line
CAUSE = b"""\
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 156, in _create_tcp_store
    store = TCPStore(
            ^^^^^^^^^
torch.distributed.DistNetworkError: The client socket has timed out after 10000ms while trying to connect to (127.0.0.1, 24650).

The above exception was the direct cause of the following exception:

"""  # noqa: E501
CHAINED = b"""\
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 158, in _create_tcp_store
    raise RendezvousConnectionError(
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. See inner exception for details.
"""  # noqa: E501
CHILD_FAILED = b"""\
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
emb.training.train FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 22729)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""  # noqa: W291
CPP_WARNING = b"""\
[W1128 09:53:02.669976037 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host 127.0.0.1:24650 - retrying (try=0, timeout=10000ms, delay=5354ms): The client socket has timed out
Exception raised from throwTimeoutError at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/socket.cpp:1030 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char>) + 0x9d (0x7f4f44b79b8d in /venv/lib/python3.11/site-packages/torch/lib/libc10.so)
<omitting python frames>
frame #30: _start + 0x21 (0x558f0bf3d081 in /venv/bin/python3)

"""  # noqa: E501
LOG_LINE = b"2026-11-28 09:40:56 INFO emb.training.loop: epoch 1\n"


def relay(*chunks: bytes) -> tuple[TorchrunOutput, io.BytesIO]:
    """``chunks`` written to a real pipe and read through a TorchrunOutput to its end."""
    read_end, write_end = os.pipe()
    sink = io.BytesIO()
    output = TorchrunOutput(sink)
    output.read(os.fdopen(read_end, "rb"))
    with os.fdopen(write_end, "wb") as pipe:
        for chunk in chunks:
            pipe.write(chunk)
    deadline = time.monotonic() + 10
    while output._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return output, sink


def test_lines_and_a_workers_traceback_pass_at_once_torchruns_own_is_held() -> None:
    output, sink = relay(LOG_LINE, WORKER_TRACEBACK, LOG_LINE, AGENT_TRACEBACK)
    assert sink.getvalue() == LOG_LINE + WORKER_TRACEBACK + LOG_LINE  # before release
    output.release(explained=False)
    assert sink.getvalue() == LOG_LINE + WORKER_TRACEBACK + LOG_LINE + AGENT_TRACEBACK


def test_torchruns_traceback_becomes_one_line_where_the_launcher_explains() -> None:
    output, sink = relay(LOG_LINE, AGENT_TRACEBACK)
    output.release(explained=True)
    assert sink.getvalue() == LOG_LINE + b"torchrun: RendezvousTimeoutError\n"


def test_an_explained_failure_keeps_a_workers_traceback_whole() -> None:
    """Only torchrun's frames are dropped: what a worker said stays."""
    output, sink = relay(WORKER_TRACEBACK)
    output.release(explained=True)
    assert sink.getvalue() == WORKER_TRACEBACK


def test_a_chained_traceback_of_torchruns_becomes_its_last_exception() -> None:
    """Its cause (a traceback of torch's rendezvous, without torchrun's frames) included."""
    output, sink = relay(LOG_LINE, CAUSE, CHAINED)
    assert sink.getvalue() == LOG_LINE
    output.release(explained=True)
    assert sink.getvalue() == LOG_LINE + (
        b"torchrun: RendezvousConnectionError: The connection to the C10d store has failed. See"
        b" inner exception for details.\n"
    )


def test_torchruns_failure_summary_goes_with_its_traceback() -> None:
    output, sink = relay(CHILD_FAILED)
    output.release(explained=True)
    assert sink.getvalue() == b"torchrun: ChildFailedError\n"


def test_torchs_cpp_stack_dumps_are_dropped_their_log_line_kept() -> None:
    output, sink = relay(CPP_WARNING, LOG_LINE)
    output.release(explained=False)
    assert sink.getvalue() == CPP_WARNING.split(b"\n", 1)[0] + b"\n" + LOG_LINE


def test_a_workers_traceback_with_nothing_after_it_passes_on_within_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing shows that a traceback is complete but the next line: one that pauses is
    passed on after ``CHAIN_S`` (a traceback is printed in one go)."""
    monkeypatch.setattr(torchrun_output, "CHAIN_S", 0.2)
    read_end, write_end = os.pipe()
    sink = io.BytesIO()
    output = TorchrunOutput(sink)
    output.read(os.fdopen(read_end, "rb"))
    with os.fdopen(write_end, "wb") as pipe:
        pipe.write(WORKER_TRACEBACK)
        pipe.flush()
        deadline = time.monotonic() + 5
        while sink.getvalue() != WORKER_TRACEBACK and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sink.getvalue() == WORKER_TRACEBACK  # the pipe still open
    output.release(explained=True)


WORKER_CPP_ERROR = b"""\
Traceback (most recent call last):
  File "/repo/src/emb/training/train.py", line 84, in train
    dist.init_process_group(
RuntimeError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use
Exception raised from makeWithPort at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp:282 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char>) + 0x9d (0x7f4f44b79b8d in /venv/lib/python3.11/site-packages/torch/lib/libc10.so)

"""  # noqa: E501 - a worker's c10::Error, its C++ stack in the message (TORCH_SHOW_CPP_STACKTRACES)


def test_a_workers_exception_raised_from_without_a_torch_log_line_above_it_is_kept() -> None:
    """Only a dump directly under torch's own ``[E...]``/``[W...]`` line is dropped: a
    worker's error message that carries its C++ stack, or such a line under any other line
    (even one after a torch log line), passes on whole."""
    output, sink = relay(LOG_LINE, WORKER_CPP_ERROR, LOG_LINE)
    output.release(explained=True)
    assert sink.getvalue() == LOG_LINE + WORKER_CPP_ERROR + LOG_LINE
    log_line = CPP_WARNING.split(b"\n", 1)[0] + b"\n"
    dump = CPP_WARNING.split(b"\n", 1)[1]
    output, sink = relay(log_line, LOG_LINE, dump, LOG_LINE)
    output.release(explained=False)
    assert sink.getvalue() == log_line + LOG_LINE + dump + LOG_LINE

"""The launchers' heartbeats (emb.cluster.watch) in one process: who is lost, who never came."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import HTTPServer, SimpleHTTPRequestHandler

import pytest
from test_two_nodes import free_port

from emb.cluster.watch import REQUEST_S, SILENT_S, NodeWatch, store_port


def registered(*watches: NodeWatch, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(w.registered for w in watches):
        assert time.monotonic() < deadline, "a node never registered"
        time.sleep(0.05)


def test_a_node_that_stops_beating_is_named_by_the_others() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    first = NodeWatch(endpoint, "node0", 3, True, 10)
    second = NodeWatch(endpoint, "node1", 3, False, 10)
    third = NodeWatch(endpoint, "node2", 3, False, 10)
    try:
        registered(first, second, third)
        second.close()  # node1 goes silent; node2 keeps beating
        tick = time.monotonic()
        assert first.lost() == ([f"node1 (no heartbeat for {SILENT_S:.0f} s)"], True)
        assert time.monotonic() - tick < SILENT_S + 5
    finally:
        for watch in (first, second, third):
            watch.close()


def test_nodes_that_never_came_are_counted_not_named() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    first = NodeWatch(endpoint, "node0", 2, True, 5)
    try:
        registered(first)
        assert first.lost() == (["1 node(s) that never came in 5 s"], False)
    finally:
        first.close()


def test_a_first_node_never_reached_is_named_as_such() -> None:
    alone = NodeWatch(f"127.0.0.1:{free_port()}", "node1", 2, False, 3)
    try:
        time.sleep(4)  # its connection attempt gives up after 3 s
        lost, started = alone.lost()
        assert not started and lost[0].startswith("the first node (store 127.0.0.1:")
        assert lost[0].endswith("never reached in 3 s")
    finally:
        alone.close()


def test_an_error_in_the_heartbeat_thread_is_one_warning_not_a_dead_thread(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port no store can take (the launcher refuses it first; this is for what no check
    foresaw): the socket's OverflowError, said in one line; the thread ends without a
    traceback."""
    uncaught: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    watch = NodeWatch("127.0.0.1:295000", "node0", 2, True, 1)
    watch.close()  # joins the thread
    assert uncaught == []
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: node0: heartbeat stopped (OverflowError: ")
    assert line.endswith("); a lost node will not be named")


def test_the_store_port_stays_a_port_for_every_rendezvous_port() -> None:
    assert store_port(29500) == 39500
    assert store_port(60000) == 50000  # 70000 is no port
    assert all(1 <= store_port(p) <= 65535 for p in (1, 55535, 55536, 65535))


class QuietFiles(SimpleHTTPRequestHandler):
    """Another HTTP server, its log kept out of the test's stderr (which must stay empty)."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def foreign_listener(port: int, kind: str) -> Iterator[None]:
    """Something that is not the store on its port, as another job's listener may be: one that
    accepts and stays silent, one that hangs up at once, or an HTTP server of its own."""
    if kind == "http":
        server = HTTPServer(("127.0.0.1", port), QuietFiles)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield
        finally:
            server.shutdown()
            server.server_close()
        return
    held: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", port)) as listener:
        listener.settimeout(0.2)
        done = threading.Event()

        def accept() -> None:
            while not done.is_set():
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                if kind == "silent":
                    held.append(connection)
                else:
                    connection.close()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            for connection in held:
                connection.close()


@pytest.mark.parametrize("kind", ["silent", "hangs-up", "http"])
def test_another_listener_on_the_store_port_is_a_first_node_never_reached(
    kind: str, capfd: pytest.CaptureFixture
) -> None:
    """Within the stated wait, in the launcher's own words: no stack dump, no hang (torch's
    client hung past its timeout on a silent listener and dumped C++ stacks on the others)."""
    port = free_port()
    with foreign_listener(store_port(port), kind):
        alone = NodeWatch(f"127.0.0.1:{port}", "node1", 2, False, 3)
        tick = time.monotonic()
        try:
            time.sleep(3)
            lost, started = alone.lost()
        finally:
            alone.close()
        took = time.monotonic() - tick
    assert (lost, started) == ([f"the first node (store 127.0.0.1:{store_port(port)}), never "
                                "reached in 3 s"], False)  # fmt: skip
    assert took < 3 + SILENT_S + 2 * REQUEST_S + 2, f"{took:.1f} s"
    sys.stderr.flush()
    assert capfd.readouterr().err == ""

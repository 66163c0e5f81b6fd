"""The launchers' heartbeats (emb.cluster.watch) in one process: who is lost, who never came."""

from __future__ import annotations

import threading
import time

import pytest
from test_two_nodes import free_port

from emb.cluster.watch import SILENT_S, NodeWatch, store_port


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
    foresaw): torch's TypeError, said in one line; the thread ends without a traceback."""
    uncaught: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    watch = NodeWatch("127.0.0.1:295000", "node0", 2, True, 1)
    watch.close()  # joins the thread
    assert uncaught == []
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: node0: heartbeat stopped (TypeError: ")
    assert line.endswith("); a lost node will not be named")


def test_the_store_port_stays_a_port_for_every_rendezvous_port() -> None:
    assert store_port(29500) == 39500
    assert store_port(60000) == 50000  # 70000 is no port
    assert all(1 <= store_port(p) <= 65535 for p in (1, 55535, 55536, 65535))

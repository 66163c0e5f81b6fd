"""Which node of a multi-node launch was lost: the launchers' heartbeats, one store per job.

When a node dies (killed, crashed, rebooted), the ranks on the other nodes fail in their next
collective (a closed connection: at once; a silent peer: after ``train.collective_timeout_s``)
and name at most an address, which on a cluster says little and on one machine nothing. So
each node's launcher beats while its node command runs: the first node's launcher hosts a small
TCP store (:func:`store_port`: the rendezvous port + :data:`PORT_OFFSET`, alive as long as that
launcher), every launcher registers its node's name there and increments its own counter every
:data:`BEAT_S`. When the node command fails, the launcher compares the counters over
:data:`SILENT_S`: a node whose counter stood still, or that never registered, is lost, and an
unreachable store means the first node is. torch is imported only here, and only across nodes.

The heartbeat is help, not a condition of the run: whatever goes wrong in its thread is said in
one warning line and the training goes on unwatched; the thread never ends with a traceback.
A client connects only once the store's port answers (:func:`wait_for_port`): torch's client,
left to retry, logs a C++ stack dump at every try into the job's log.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from datetime import timedelta

PORT_OFFSET = 10000  # the store's port above the rendezvous port (29400 + job id % 10000)
MAX_PORT = 65535
BEAT_S = 1.0
SILENT_S = 4.0  # four missed beats: lost (a busy node still beats: the launcher only waits)


def store_port(rendezvous_port: int) -> int:
    """The heartbeat store's port: :data:`PORT_OFFSET` above the rendezvous port, or below it
    where above would pass 65535 (the same on every node, from the endpoint alone)."""
    above = rendezvous_port + PORT_OFFSET
    return above if above <= MAX_PORT else rendezvous_port - PORT_OFFSET


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    """Return once ``host:port`` accepts a connection; ``ConnectionError`` after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(1.0, timeout_s))).close()
            return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"no answer from {host}:{port} in {timeout_s:.0f} s "
                                      f"({err.strerror or err})") from None  # fmt: skip
            time.sleep(0.2)


class NodeWatch:
    """This node's heartbeat in the job's store, and who stopped beating."""

    def __init__(self, endpoint: str, name: str, nodes: int, hosts: bool, connect_s: float):
        host, port = endpoint.rsplit(":", 1)
        host = host.strip("[]")  # an IPv6 address, as torchrun's endpoint writes it
        self.name, self.nodes, self.host, self.port = name, nodes, host, store_port(int(port))
        self.connect_s, self.hosts = connect_s, hosts
        self._stop = threading.Event()
        self.registered = False
        self._server = None
        # torch's import takes seconds: in the thread, so the node command starts at once
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        """The thread: :meth:`_host_and_beat`, any error in it one warning line, not a traceback
        (the launcher validates the endpoint; this is for what no check foresaw)."""
        try:
            self._host_and_beat()
        except Exception as err:  # noqa: BLE001 - a heartbeat must never end with a traceback
            print(f"warning: {self.name}: heartbeat stopped ({type(err).__name__}: "
                  f"{' '.join(str(err).split())[:200]}); a lost node will not be named",
                  file=sys.stderr, flush=True)  # fmt: skip

    def _host_and_beat(self) -> None:
        """Host the store (first node), register, then beat until stopped; a node arriving
        before the first keeps trying to connect for ``connect_s``."""
        if self.hosts:  # alive as long as this launcher, whatever torchrun does
            from torch.distributed import TCPStore

            try:
                self._server = TCPStore(
                    self.host, self.port, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=self.connect_s),
                )  # fmt: skip
            except (RuntimeError, ValueError) as err:  # port taken: training goes on unwatched
                print(f"warning: {self.name}: no heartbeat store on port {self.port} ({err}); "
                      "a lost node will not be named", file=sys.stderr, flush=True)  # fmt: skip
        try:
            store = self._client(self.connect_s)
            index = store.add("joined", 1) - 1
            store.set(f"name/{index}", self.name)
            self.registered = True
            while not self._stop.is_set():
                store.add(f"beat/{index}", 1)
                self._stop.wait(BEAT_S)
        except (RuntimeError, OSError):  # torch's store errors: the store (never) went away
            return  # lost() reports it, naming the first node

    def lost(self) -> tuple[list[str], bool]:
        """(the nodes that stopped beating or never came, whether every node had come);
        waits ``SILENT_S``."""
        first = f"the first node (store {self.host}:{self.port})"
        try:
            store = self._client(SILENT_S)
            names, before = self._counters(store)
            time.sleep(SILENT_S)
            _, after = self._counters(store)
        except Exception as err:  # noqa: BLE001 - any store failure means its host is gone
            if not self.registered:
                return [f"{first}, never reached in {self.connect_s:.0f} s"], False
            return [f"{first}, which stopped answering ({' '.join(str(err).split())[:200]})"], True
        silent = [f"{n} (no heartbeat for {SILENT_S:.0f} s)" for n in names
                  if n != self.name and before[n] == after[n]]  # fmt: skip
        missing = self.nodes - len(names)
        if missing > 0:
            silent.append(f"{missing} node(s) that never came in {self.connect_s:.0f} s")
        return silent, missing <= 0

    def _client(self, timeout_s: float):
        """A client of the store, once its port answers: torch's own client, left to retry a
        port that does not, logs a C++ stack dump at every try."""
        from torch.distributed import TCPStore

        wait_for_port(self.host, self.port, timeout_s)
        return TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=timeout_s))

    @staticmethod
    def _counters(store) -> tuple[list[str], dict[str, int]]:
        joined = store.add("joined", 0)
        names = [store.get(f"name/{i}").decode() for i in range(joined)]
        return names, {n: store.add(f"beat/{i}", 0) for i, n in enumerate(names)}

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self._thread.join(timeout=2 * BEAT_S)

"""Which node of a multi-node launch was lost: the launchers' heartbeats, one store per job.

When a node dies (killed, crashed, rebooted), the ranks on the other nodes fail in their next
collective (a closed connection: at once; a silent peer: after ``train.collective_timeout_s``)
and name at most an address, which on a cluster says little and on one machine nothing. So
each node's launcher beats while its node command runs: the first node's launcher hosts a small
HTTP store (:func:`store_port`: the rendezvous port + :data:`PORT_OFFSET`, alive as long as that
launcher), every launcher registers its node's name there and increments its own counter every
:data:`BEAT_S`. When the node command fails, the launcher compares the counters over
:data:`SILENT_S`: a node whose counter stood still, or that never registered, is lost, and an
unreachable store means the first node is.

The store is the standard library's HTTP server, not torch's ``TCPStore``: the store's port
lies in Linux's ephemeral range (32768-60999), where another job's listener (gloo's, NCCL's)
may sit, and torch's client, meeting such a listener, logs a C++ stack dump at every try into
the job's log, and hangs past its timeout on one that accepts and stays silent (measured:
torch 2.13, a 4 s timeout, still waiting after 25 s). Here every request has its own socket
timeout, and an answer that is not this store's is refused like no answer.

The heartbeat is help, not a condition of the run: whatever goes wrong in its thread is said in
one warning line and the training goes on unwatched; the thread never ends with a traceback.
"""

from __future__ import annotations

import http.client
import json
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT_OFFSET = 10000  # the store's port above the rendezvous port (29400 + job id % 10000)
MAX_PORT = 65535
BEAT_S = 1.0
SILENT_S = 4.0  # four missed beats: lost (a busy node still beats: the launcher only waits)
REQUEST_S = 2.0  # one request's socket timeout
RETRY_S = 0.2
PATH = "/emb-heartbeat"  # a listener that is not this store answers it with an error, or not
STORE_ERRORS = (OSError, http.client.HTTPException, ValueError, KeyError, TypeError)


def store_port(rendezvous_port: int) -> int:
    """The heartbeat store's port: :data:`PORT_OFFSET` above the rendezvous port, or below it
    where above would pass 65535 (the same on every node, from the endpoint alone)."""
    above = rendezvous_port + PORT_OFFSET
    return above if above <= MAX_PORT else rendezvous_port - PORT_OFFSET


class HeartbeatStore(ThreadingHTTPServer):
    """The nodes' names and beat counters, served on every interface of the first node (IPv6
    and IPv4 where the machine has both)."""

    daemon_threads = True
    address_family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET

    def __init__(self, port: int):
        self.names: list[str] = []
        self.beats: list[int] = []
        self.lock = threading.Lock()
        super().__init__(("", port), StoreRequests)

    def server_bind(self) -> None:
        """Both address families on one socket; and no ``getfqdn`` (HTTPServer's own bind asks
        DNS for this host's name, seconds where DNS is slow, for a name nobody reads)."""
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "emb-heartbeat", self.server_address[1]

    def serve_in_background(self) -> None:
        threading.Thread(target=self.serve_forever, name="emb-heartbeat-store", daemon=True).start()

    def answer(self, method: str, path: str, body: bytes) -> dict:
        """The store's three requests: ``POST join`` (body: the node's name; its index back),
        ``POST beat/I``, ``GET state`` (every name and counter)."""
        with self.lock:
            if method == "POST" and path == f"{PATH}/join":
                self.names.append(body.decode("utf-8", "replace"))
                self.beats.append(0)
                return {"index": len(self.names) - 1}
            if method == "POST" and path.startswith(f"{PATH}/beat/"):
                self.beats[int(path.rsplit("/", 1)[1])] += 1
                return {}
            if method == "GET" and path == f"{PATH}/state":
                return {"names": list(self.names), "beats": list(self.beats)}
        raise KeyError(path)


class StoreRequests(BaseHTTPRequestHandler):
    """One request to the :class:`HeartbeatStore`: JSON back, 404 for what it does not know."""

    server: HeartbeatStore

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._reply("GET")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self._reply("POST")

    def _reply(self, method: str) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            data, status = json.dumps(self.server.answer(method, self.path, body)).encode(), 200
        except (KeyError, ValueError, IndexError):
            data, status = b"{}", 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - silent: beats
        pass


def ask(host: str, port: int, method: str, path: str, body: bytes = b"",
        timeout_s: float = REQUEST_S) -> dict:  # fmt: skip
    """One request to the store at ``host:port``; an error (see :data:`STORE_ERRORS`) when
    nothing answers in ``timeout_s``, or something that is not the store."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request(method, PATH + path, body=body)
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise http.client.HTTPException(f"HTTP {response.status} from {host}:{port}")
        answer = json.loads(data)
        if not isinstance(answer, dict):
            raise ValueError(f"not the heartbeat store at {host}:{port}")
        return answer
    finally:
        connection.close()


class NodeWatch:
    """This node's heartbeat in the job's store, and who stopped beating."""

    def __init__(self, endpoint: str, name: str, nodes: int, hosts: bool, connect_s: float):
        host, port = endpoint.rsplit(":", 1)
        host = host.strip("[]")  # an IPv6 address, as torchrun's endpoint writes it
        self.name, self.nodes, self.host, self.port = name, nodes, host, store_port(int(port))
        self.connect_s, self.hosts = connect_s, hosts
        self._stop = threading.Event()
        self.registered = False
        self._server: HeartbeatStore | None = None
        self._thread = threading.Thread(target=self._beat, name="emb-heartbeat", daemon=True)
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
        before the first keeps trying to register for ``connect_s``."""
        if self.hosts:  # alive as long as this launcher, whatever torchrun does
            try:
                self._server = HeartbeatStore(self.port)
                self._server.serve_in_background()
            except OSError as err:  # port taken: training goes on unwatched
                print(f"warning: {self.name}: no heartbeat store on port {self.port} ({err}); "
                      "a lost node will not be named", file=sys.stderr, flush=True)  # fmt: skip
        index = self._join()
        if index is None:
            return  # lost() reports it, naming the first node
        self.registered = True
        while not self._stop.is_set():
            try:
                ask(self.host, self.port, "POST", f"/beat/{index}")
            except STORE_ERRORS:  # the store went away: lost() reports it
                return
            self._stop.wait(BEAT_S)

    def _join(self) -> int | None:
        """This node's index in the store, asked until ``connect_s`` has passed (None then)."""
        deadline = time.monotonic() + self.connect_s
        while not self._stop.is_set():
            try:
                return int(ask(self.host, self.port, "POST", "/join", self.name.encode())["index"])
            except STORE_ERRORS:
                if time.monotonic() >= deadline:
                    return None
                self._stop.wait(RETRY_S)
        return None

    def lost(self) -> tuple[list[str], bool]:
        """(the nodes that stopped beating or never came, whether every node had come);
        waits ``SILENT_S``."""
        first = f"the first node (store {self.host}:{self.port})"
        try:
            names, before = self._counters()
            time.sleep(SILENT_S)
            _, after = self._counters()
        except STORE_ERRORS as err:  # any store failure means its host is gone
            if not self.registered:
                return [f"{first}, never reached in {self.connect_s:.0f} s"], False
            return [f"{first}, which stopped answering ({' '.join(str(err).split())[:200]})"], True
        silent = [f"{n} (no heartbeat for {SILENT_S:.0f} s)" for n in names
                  if n != self.name and before[n] == after[n]]  # fmt: skip
        missing = self.nodes - len(names)
        if missing > 0:
            silent.append(f"{missing} node(s) that never came in {self.connect_s:.0f} s")
        return silent, missing <= 0

    def _counters(self) -> tuple[list[str], dict[str, int]]:
        state = ask(self.host, self.port, "GET", "/state", timeout_s=SILENT_S)
        names = [str(n) for n in state["names"]]
        return names, dict(zip(names, (int(b) for b in state["beats"]), strict=True))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * BEAT_S + REQUEST_S)

"""A port of the host inside a `blocked` sandbox (`Sandbox.expose`), carried by the exec agent.

A real HTTP server runs on this host's loopback; processes in a real sandbox, whose network stays
`blocked`, reach it through `127.0.0.1:PORT` of their own loopback: one request, a streamed
answer read piece by piece, eight at once, a half-close. The sandbox reaches nothing else, and
closing the exposure (or deleting the sandbox) refuses new connections. Then a hostile agent (a
loopback double, as in `test_hostile_host.py`) answers the host's `/accept` calls with tunnels
that name other addresses, hold on forever, or are no tunnels at all: the host connects to its
target only, keeps to its bounds, and logs each kind of failure once.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env import Client
from orchard.env.backends import DockerConfig
from orchard.env.backends.base import AgentEndpoint
from orchard.env.calls import AgentCalls, Call, ServiceCalls
from orchard.env.client import Exposure, Sandbox
from orchard.env.manager import async_agent_http
from orchard.env.transport import AgentChannel, HttpxChannel
from orchard.errors import AgentError, ConfigError, Conflict, InvalidRequest
from orchard.store import Store

PORT = 9000
"""The port of the sandbox's loopback that reaches the host's server."""


class HostServer(http.server.ThreadingHTTPServer):
    """The host's server (stdlib, threaded, HTTP/1.1, on 127.0.0.1:0): what the sandbox calls.

    `/x...` echoes its path and the peer; `/slow` answers after 0.5 s and counts how many it held
    at once; `/stream` sends a chunked answer, its first piece at once and the rest only once
    `/release` was asked (or after 10 s), noting the order of all three in `events`.
    """

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), Handler)
        self.port = self.server_address[1]
        self.lock = threading.Lock()
        self.peers: list[str] = []
        self.events: list[str] = []
        self.release = threading.Event()
        self.busy = self.peak = 0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HostServer

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.peers.append(self.client_address[0])
        route = self.path.split("?")[0]
        if route == "/stream":
            self.stream()
        elif route == "/release":
            self.server.events.append("release asked")
            self.server.release.set()
            self.answer(b"released")
        elif route == "/slow":
            with self.server.lock:
                self.server.busy += 1
                self.server.peak = max(self.server.peak, self.server.busy)
            time.sleep(0.5)
            with self.server.lock:
                self.server.busy -= 1
            self.answer(f"slow {self.path.split('=')[-1]}".encode())
        else:
            self.answer(f"hello {self.path} from {self.client_address[0]}".encode())

    def answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def stream(self) -> None:
        """Like a chat completion's SSE stream: a piece, a wait, the rest in pieces with pauses."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.chunk(b"data: 1\n")
        self.server.events.append("first sent")
        self.server.release.wait(10)
        for piece in (b"data: 2\n", b"data: 3\n", b"data: [DONE]\n"):
            time.sleep(0.05)
            self.chunk(piece)
        self.server.events.append("last sent")
        self.wfile.write(b"0\r\n\r\n")

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def host_server() -> Iterator[HostServer]:
    server = HostServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def box(client, base_image):
    with client.create(base_image, network="blocked") as box:
        yield box


@pytest.fixture
def exposed(box, host_server) -> Iterator[Exposure]:
    with box.expose(PORT, ("127.0.0.1", host_server.port)) as exposure:
        yield exposure


def python(box, script: str, timeout: float = 60):
    """Run a Python script in the sandbox; its result."""
    box.write_file("/tmp/script.py", script)
    return box.exec("python3 /tmp/script.py", timeout=timeout)


GET = """
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:{port}{path}", timeout=20).read().decode())
"""


def expose_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("orchard-expose")]


def wait_for(condition: Callable[[], bool], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- a real sandbox ------------------------------------------------------------------------


def test_a_request_from_inside_reaches_the_hosts_server(box, host_server, exposed):
    got = python(box, GET.format(port=PORT, path="/x?y=1"))
    assert got.ok, got.stderr
    assert got.stdout == "hello /x?y=1 from 127.0.0.1\n"  # sent from this host's loopback
    assert exposed.carried == 1 and wait_for(lambda: exposed.active == 0)


def test_a_streamed_answer_arrives_piece_by_piece(box, host_server, exposed):
    """The sandbox reads the first piece before the server sends the last: the server sends the
    rest only once the sandbox, having read the first, asks /release (through the same port)."""
    host_server.events.clear()
    host_server.release.clear()
    got = python(
        box,
        f"""
import urllib.request
answer = urllib.request.urlopen("http://127.0.0.1:{PORT}/stream", timeout=20)
print("first", answer.readline().decode().strip(), flush=True)
urllib.request.urlopen("http://127.0.0.1:{PORT}/release", timeout=20).read()
print("rest", answer.read().decode().split(), flush=True)
""",
    )
    assert got.ok, got.stderr
    assert host_server.events == ["first sent", "release asked", "last sent"]
    assert got.stdout == "first data: 1\nrest ['data:', '2', 'data:', '3', 'data:', '[DONE]']\n"


def test_eight_requests_at_once_are_all_answered_side_by_side(box, host_server, exposed):
    host_server.peak = 0
    got = python(
        box,
        f"""
import concurrent.futures, urllib.request
def get(i):
    return urllib.request.urlopen(f"http://127.0.0.1:{PORT}/slow?i={{i}}", timeout=30).read().decode()
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    print(",".join(pool.map(get, range(8))))
""",
    )
    assert got.ok, got.stderr
    assert got.stdout == ",".join(f"slow {i}" for i in range(8)) + "\n"
    assert host_server.peak >= 4  # carried at once, not one after the other


def test_a_half_close_is_passed_on_both_ways(box):
    """A client that shuts its sending side still gets the answer of a server that reads to EOF."""
    listener = socket.create_server(("127.0.0.1", 0))

    def reverse_until_eof() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            conn.sendall(data[::-1])

    threading.Thread(target=reverse_until_eof, daemon=True).start()
    with box.expose(PORT + 1, ("127.0.0.1", listener.getsockname()[1])):
        got = python(
            box,
            f"""
import socket
s = socket.create_connection(("127.0.0.1", {PORT + 1}), timeout=20)
s.sendall(b"abc" * 100000)
s.shutdown(socket.SHUT_WR)
data = b""
while chunk := s.recv(65536):
    data += chunk
print(len(data), data[:6].decode())
""",
        )
    listener.close()
    assert got.ok, got.stderr
    assert got.stdout == "300000 cbacba\n"


def bridge_address(docker_client) -> str:
    """This host's address on Docker's default bridge, read from the bridge's interface: an engine
    may leave the gateway out of the network's IPAM config (Debian's docker.io 20.10 does)."""
    options = docker_client.networks.get("bridge").attrs.get("Options") or {}
    device = options.get("com.docker.network.bridge.name", "docker0")
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", device], capture_output=True, text=True)
    assert shown.returncode == 0 and " inet " in shown.stdout, shown.stderr or f"{device} has no IPv4 address"
    return shown.stdout.split(" inet ")[1].split("/")[0]


def test_the_network_stays_blocked_and_only_the_target_is_reached(box, host_server, exposed, docker_client):
    """With the port exposed, the sandbox still has loopback only: this host's server, on every
    address of this host, is out of its reach but for the one exposed port."""
    everywhere = HostServer("0.0.0.0")
    threading.Thread(target=everywhere.serve_forever, daemon=True).start()
    try:
        bridge = bridge_address(docker_client)
        port = everywhere.server_address[1]
        assert httpx.get(f"http://{bridge}:{port}/direct").text.startswith("hello /direct")  # there for a route
        assert box.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | xargs").stdout == "lo\n"
        direct = python(box, GET.format(port=port, path="/direct").replace("127.0.0.1", bridge))
        assert direct.exit_code != 0 and "unreachable" in direct.stderr.lower()
        own_loopback = python(box, GET.format(port=port, path="/direct"))
        assert own_loopback.exit_code != 0 and "refused" in own_loopback.stderr.lower()
        assert python(box, GET.format(port=PORT, path="/through")).stdout.startswith("hello /through")
    finally:
        everywhere.shutdown()
        everywhere.server_close()


def test_close_refuses_new_connections_and_deleting_the_sandbox_closes(client, base_image, box, host_server):
    exposure = box.expose(PORT + 2, ("127.0.0.1", host_server.port))
    with pytest.raises(Conflict, match="exposed already"):
        box.expose(PORT + 2, ("127.0.0.1", host_server.port))
    assert python(box, GET.format(port=PORT + 2, path="/before")).ok
    exposure.close()
    refused = python(box, GET.format(port=PORT + 2, path="/after"))
    assert refused.exit_code != 0 and "Connection refused" in refused.stderr
    with client.create(base_image, network="blocked") as other:
        exposure = other.expose(PORT, ("127.0.0.1", host_server.port))
        assert python(other, GET.format(port=PORT, path="/other")).ok
    assert exposure.closed and exposure.active == 0
    assert wait_for(lambda: not expose_threads())


def test_a_port_held_in_the_sandbox_is_a_conflict(box, host_server):
    box.exec("nohup python3 -m http.server 9100 --bind 127.0.0.1 >/dev/null 2>&1 &")
    assert wait_for(lambda: box.exec("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9100))'").ok)
    with pytest.raises(Conflict, match=r"127\.0\.0\.1:9100 is taken in the sandbox"):
        box.expose(9100, ("127.0.0.1", host_server.port))
    with pytest.raises(InvalidRequest, match="target"):
        box.expose(9101, "127.0.0.1:80")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="port"):
        box.expose(0, ("127.0.0.1", host_server.port))


def test_the_async_sandbox_exposes_too(client, box, host_server):
    from orchard.env.client import AsyncSandbox

    endpoint = client._manager.get(box.id).endpoint

    async def run() -> Exposure:
        channel = async_agent_http(endpoint)
        handle = AsyncSandbox(box.id, "", channel, AgentCalls(), lambda _id: asyncio.sleep(0))
        exposure = await handle.expose(PORT + 3, ("127.0.0.1", host_server.port))
        got = await asyncio.to_thread(python, box, GET.format(port=PORT + 3, path="/async"))
        assert got.stdout == "hello /async from 127.0.0.1\n"
        await handle.delete()  # closes what it exposed
        await channel.aclose()
        return exposure

    assert asyncio.run(run()).closed


def test_under_gvisor_too(runsc, base_image, host_server, tmp_path):
    """gVisor's own network stack listens, hands over and refuses as Linux does."""
    store = Store.open(f"sqlite:///{tmp_path}/orchard.db")
    with Client(backend=DockerConfig(runtime=runsc), store=store) as gvisor, gvisor.create(base_image) as box:
        with box.expose(PORT, ("127.0.0.1", host_server.port)):
            assert python(box, GET.format(port=PORT, path="/gvisor")).stdout == "hello /gvisor from 127.0.0.1\n"
        refused = python(box, GET.format(port=PORT, path="/after"))
        assert refused.exit_code != 0 and "Connection refused" in refused.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_agent_over_tcp_carries_connections_too(host_server, tmp_path):
    """As on Kubernetes, where the host reaches the agent at its Pod's address: the real agent,
    run on this host over TCP (so the "sandbox's" loopback is this host's)."""
    server = Path(__file__).resolve().parents[2] / "orchard" / "env" / "agent" / "__main__.py"
    agent_port, exposed_port = free_port(), free_port()
    argv = [sys.executable, "-s", "-S", str(server), "--tcp", f"127.0.0.1:{agent_port}", "--workdir", str(tmp_path)]
    proc = subprocess.Popen(argv, env={**os.environ, "ORCHARD_AGENT_TOKEN": "tcp-token"}, stderr=subprocess.PIPE)
    try:
        endpoint = AgentEndpoint(token="tcp-token", url=f"http://127.0.0.1:{agent_port}")
        assert wait_for(lambda: proc.poll() is None and _answers(endpoint))
        box = Sandbox("tcp", "", AgentChannel(endpoint), AgentCalls(), lambda _id: None)
        with box.expose(exposed_port, ("127.0.0.1", host_server.port)) as exposure:
            got = httpx.get(f"http://127.0.0.1:{exposed_port}/over-tcp", headers={"Connection": "close"})
            assert got.text == "hello /over-tcp from 127.0.0.1" and exposure.carried == 1
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{exposed_port}/closed")
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(endpoint: AgentEndpoint) -> bool:
    try:
        with AgentChannel(endpoint) as channel:
            return channel.request(Call("GET", "/health", lambda r: r)).status_code == 200
    except AgentError:
        return False


def test_expose_needs_a_direct_client():
    with httpx.Client(base_url="http://127.0.0.1:9") as http:
        box = Sandbox("svc", "", HttpxChannel(http), ServiceCalls("svc"), lambda _id: None, owns_http=False)
        with pytest.raises(ConfigError, match="expose needs a direct client"):
            box.expose(PORT, ("127.0.0.1", 80))


# -- a hostile agent -----------------------------------------------------------------------

UPGRADED = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: orchard-tunnel\r\nConnection: Upgrade\r\n"


class TunnelAgent:
    """A loopback double of a hostile agent: `/listen` and `DELETE /listen` answered as the agent
    does (or with `listen`, raw bytes), each `/accept` handed to `accept(conn, agent)`, which
    returns True to read the next request on that connection. It counts the `/accept` calls and
    how many of its tunnels are open at once (`open`, `peak`)."""

    def __init__(self, folder: Path, accept: Callable[[socket.socket, TunnelAgent], bool | None], listen: bytes = b""):
        self.accept, self.listen = accept, listen
        self.accepts = self.open = self.peak = 0
        self.lock = threading.Lock()
        path = str(folder / f"agent-{len(list(folder.glob('*.sock')))}.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(256)
        self.endpoint = AgentEndpoint(uds=path, token="t")
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            reader = conn.makefile("rb")
            while line := reader.readline():
                length = 0
                while (header := reader.readline()) not in (b"\r\n", b""):
                    if header.lower().startswith(b"content-length:"):
                        length = int(header.split(b":")[1])
                reader.read(length)
                if line.startswith(b"POST /accept"):
                    with self.lock:
                        self.accepts += 1
                    if not self.accept(conn, self):
                        return
                    continue
                conn.sendall(self.listen or json_answer({"port": PORT, "listening": True, "closed": True}))

    @contextlib.contextmanager
    def tunnel(self) -> Iterator[None]:
        """Count a tunnel as open while in the block."""
        with self.lock:
            self.open += 1
            self.peak = max(self.peak, self.open)
        try:
            yield
        finally:
            with self.lock:
                self.open -= 1

    def sandbox(self) -> Sandbox:
        return Sandbox("hostile", "", AgentChannel(self.endpoint), AgentCalls(), lambda _id: None)


def json_answer(body: dict, status: bytes = b"200 OK") -> bytes:
    data = json.dumps(body).encode()
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (status, len(data), data)


def hold(conn: socket.socket) -> None:
    """Read until the host hangs up."""
    while conn.recv(65536):
        pass


@pytest.fixture
def hostile(tmp_path) -> Iterator[Callable[..., TunnelAgent]]:
    agents: list[TunnelAgent] = []

    def make(accept, listen: bytes = b"") -> TunnelAgent:
        agents.append(TunnelAgent(tmp_path, accept, listen))
        return agents[-1]

    yield make
    for agent in agents:
        agent.listener.close()


class Recorder:
    """A TCP server on this host's loopback that keeps what each connection sent and counts them."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = self.listener.getsockname()[1]
        self.received: list[bytes] = []
        self.connections = self.open = self.peak = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self.open += 1
                self.peak = max(self.peak, self.open)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        data = b""
        with conn, contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                data += chunk
        with self.lock:
            self.received.append(data)
            self.open -= 1

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def recorder() -> Iterator[Callable[[], Recorder]]:
    made: list[Recorder] = []

    def make() -> Recorder:
        made.append(Recorder())
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_the_host_connects_to_its_target_only_whatever_the_agent_names(hostile, recorder):
    target, decoy = recorder(), recorder()
    naming = b"Location: 127.0.0.1:%d\r\nX-Target: 127.0.0.1:%d\r\n\r\n" % (decoy.port, decoy.port)
    garbage = b"\x00\xffCONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % decoy.port

    def three_tunnels_with_garbage(conn: socket.socket, agent: TunnelAgent) -> None:
        if agent.accepts <= 3:
            conn.sendall(UPGRADED + naming + garbage)
        else:
            hold(conn)  # then no connection comes

    listen = json_answer({"port": PORT, "listening": True, "host": "127.0.0.1", "target": decoy.port})
    agent = hostile(three_tunnels_with_garbage, listen=listen)
    with agent.sandbox().expose(PORT, ("127.0.0.1", target.port)) as exposure:
        assert wait_for(lambda: len(target.received) == 3)
        assert exposure.carried == 3
    assert target.received == [garbage] * 3  # the sandbox's bytes, to the target, as they came
    assert decoy.connections == 0


def test_tunnels_held_open_stay_within_the_bounds_and_end_when_idle(hostile, recorder):
    """The agent answers every /accept with a tunnel and never closes it: the host holds at most
    `max_connections` of them (asking no more meanwhile), and ends each when it goes idle."""
    target = recorder()

    def endless(conn: socket.socket, agent: TunnelAgent) -> None:
        with agent.tunnel():
            conn.sendall(UPGRADED + b"\r\nhello")
            hold(conn)

    agent = hostile(endless)
    # idle after 2.5 s: under load, filling the 8 may take a while, and none may go idle before the check
    with agent.sandbox().expose(PORT, ("127.0.0.1", target.port), max_connections=8, idle_timeout=2.5) as exposure:
        assert wait_for(lambda: exposure.active == 8 and target.open == 8)
        time.sleep(0.5)
        assert (agent.peak, target.peak, exposure.active) == (8, 8, 8)
        assert len(expose_threads()) <= 8 * 2 + 5  # two per pair, four acceptors, the reaper
        assert wait_for(lambda: target.connections >= 16)  # the first ones went idle, new ones came
        # The host's own count: the double notices a tunnel the host closed a moment after the
        # host has asked for the next one, so its count may pass 8 for that moment.
        assert target.peak <= 8 and exposure.active <= 8
    assert wait_for(lambda: agent.open == 0 and target.open == 0)
    assert wait_for(lambda: not expose_threads())


@pytest.mark.parametrize(
    ("answer", "logged"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not HTTP"),
        (b"HTTP/1.1 101 Switching Protocols\r\n" + b"X-Flood: y\r\n" * 10000, "head over 16384 bytes"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", "not orchard-tunnel"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", "before its 30 s wait was over"),
        (json_answer({"error": "no such thing"}, b"404 Not Found"), "HTTP 404: no such thing"),
    ],
    ids=["not-http", "header-flood", "other-upgrade", "instant-204", "refusal"],
)
def test_answers_that_are_no_tunnel_are_logged_once_and_paced(hostile, recorder, caplog, answer, logged):
    target = recorder()

    def answer_at_once(conn: socket.socket, agent: TunnelAgent) -> bool:
        conn.sendall(answer)
        return answer.startswith(b"HTTP/1.1 204")  # keep-alive: the host may ask again at once

    agent = hostile(answer_at_once)
    caplog.set_level(logging.WARNING, logger="orchard.env.expose")
    exposure = agent.sandbox().expose(PORT, ("127.0.0.1", target.port))
    time.sleep(1.5)
    started = time.monotonic()
    exposure.close()
    assert time.monotonic() - started < 5
    records = [r for r in caplog.records if r.name == "orchard.env.expose"]
    assert len(records) == 1 and logged in records[0].getMessage(), [r.getMessage() for r in records]
    assert records[0].exc_info is None and "\n" not in records[0].getMessage()
    assert 4 <= agent.accepts <= 40  # asked again after pauses, not in a tight loop
    assert target.connections == 0
    assert wait_for(lambda: not expose_threads())


@pytest.mark.parametrize(
    ("listen", "error"),
    [
        (json_answer({"port": PORT + 1, "listening": True}), AgentError),
        (json_answer({"port": PORT}), AgentError),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnot", AgentError),
        (json_answer({"error": "127.0.0.1:9000 is taken in the sandbox"}, b"409 Conflict"), Conflict),
    ],
    ids=["other-port", "not-listening", "not-json", "conflict"],
)
def test_a_bad_answer_to_listen_raises_and_starts_nothing(hostile, listen, error):
    agent = hostile(lambda conn, agent: None, listen=listen)
    with pytest.raises(error):
        agent.sandbox().expose(PORT, ("127.0.0.1", 9))
    assert agent.accepts == 0 and not expose_threads()

"""A byte stream from the host to a port of a `blocked` sandbox's loopback (`Sandbox.connect`).

A real server runs inside a real sandbox on its own loopback; the host reaches it through the
exec agent (`POST /connect`), with no port published: bytes both ways, a half-close passed on,
several streams at once. The agent connects to `127.0.0.1` only: a request naming a host is
refused, and nothing listening, a port out of range or a timeout out of bounds are clear errors.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from orchard.env.agent.protocol import TUNNEL_UPGRADE
from orchard.env.transport import connect_agent
from orchard.errors import AgentError, InvalidRequest

PORT = 9300

ECHO = """
import socket, threading
server = socket.create_server(("127.0.0.1", {port}))
def serve(conn):
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    conn.sendall(b"got " + str(len(data)).encode() + b": " + data[:20])
    conn.close()
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


@pytest.fixture(scope="module")
def box(client, base_image):
    with client.create(base_image, network="blocked") as box:
        box.write_file("/tmp/echo.py", ECHO.format(port=PORT))
        box.exec("setsid python3 /tmp/echo.py >/dev/null 2>&1 < /dev/null &")
        deadline = time.monotonic() + 20
        while box.exec(f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {PORT}))'").exit_code:
            assert time.monotonic() < deadline, "the echo server did not start"
            time.sleep(0.1)
        yield box


def talk(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)  # the server reads to EOF: the half-close must reach it
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    return answer


def test_bytes_go_both_ways_and_a_half_close_is_passed_on(box):
    assert talk(box.connect(PORT), b"hello sandbox") == b"got 13: hello sandbox"


def test_a_megabyte_crosses_whole(box):
    assert talk(box.connect(PORT), b"x" * 1_000_000).startswith(b"got 1000000: xxxx")


def test_several_streams_at_once_stay_apart(box):
    socks = [box.connect(PORT) for _ in range(5)]
    answers = [talk(sock, f"stream {i}".encode()) for i, sock in enumerate(socks)]
    assert answers == [f"got 8: stream {i}".encode() for i in range(5)]


def test_nothing_listening_is_a_clear_error(box):
    with pytest.raises(AgentError, match=r"nothing listens on 127\.0\.0\.1:9301 in the sandbox"):
        box.connect(9301)


def test_bad_ports_and_timeouts_are_refused_before_anything_is_sent(box):
    with pytest.raises(InvalidRequest, match="port must be an integer from 1 to 65535"):
        box.connect(70000)
    with pytest.raises(InvalidRequest, match="timeout must be a number of seconds"):
        box.connect(PORT, timeout=0)


def test_the_agent_connects_to_its_loopback_only(box):
    """The request names a port, never a host: an agent asked for another address refuses the
    whole request rather than ignoring the field, so a client cannot be misled into thinking it
    reached one."""
    endpoint = box._http.endpoint
    sock = connect_agent(endpoint, 10)
    body = json.dumps({"port": PORT, "host": "10.0.0.1"}).encode()
    sock.sendall(
        f"POST /connect HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {endpoint.token}\r\n"
        f"Connection: Upgrade\r\nUpgrade: {TUNNEL_UPGRADE}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    sock.settimeout(10)
    answer = sock.recv(4096)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
    assert b"host" in answer

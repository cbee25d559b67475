"""HTTP to a service inside a sandbox, through its exec agent (`Sandbox.http`), on real sandboxes.

A small stdlib server runs inside a `blocked` sandbox on its own loopback (started in the
background by an exec, as a task's mock services are), next to a raw TCP server that answers
what no well-behaved service would. The host reaches both only through the agent, straight
(embedded client) and through a real `orchard up`. Then a hostile agent (a loopback double, as in
`test_hostile_host.py`) forges answers, and the host refuses each one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from orchard.env import Client, HttpAnswer
from orchard.env.backends.base import AgentEndpoint
from orchard.env.calls import AgentCalls, Call, send
from orchard.env.client import AsyncSandbox, Sandbox
from orchard.env.manager import async_agent_http
from orchard.env.transport import AgentChannel, AsyncAgentChannel
from orchard.errors import AgentError, InvalidRequest

PORT = 8080
RAW_PORT = PORT + 1

SERVICE = r'''
"""A mock service (http.server) on 127.0.0.1:PORT, and a raw one on PORT + 1 that misbehaves."""
import http.server, json, socket, sys, threading, time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        route = self.path.split("?")[0]
        status = 200
        if route.startswith("/status/"):
            status, out = int(route.rsplit("/", 1)[1]), b'{"error": "as asked"}'
        elif route.startswith("/bytes/"):
            out = b"x" * int(route.rsplit("/", 1)[1])
        else:
            seen = {"method": self.command, "path": self.path, "body": body.decode("latin-1"),
                    "headers": dict(self.headers), "peer": self.client_address[0]}
            out = json.dumps(seen).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "a=1")
        self.send_header("Set-Cookie", "b=2")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = answer

    def log_message(self, *args):
        pass


RAW = {
    "/garbage": b"SSH-2.0-OpenSSH_9.2\r\n",
    "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    "/unframed": b"HTTP/1.0 200 OK\r\nX-Framing: none\r\n\r\n" + b"y" * 3000,
    "/interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "/cut": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
}


def raw(conn):
    with conn:
        path = conn.recv(65536).split(b" ")[1].decode()
        if path not in RAW:  # /silent: never answers
            time.sleep(120)
            return
        conn.sendall(RAW[path])


def serve_raw(port):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    while True:
        threading.Thread(target=raw, args=(listener.accept()[0],), daemon=True).start()


port = int(sys.argv[1])
threading.Thread(target=serve_raw, args=(port + 1,), daemon=True).start()
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def start_service(box) -> None:
    """Start the mock services in the background (an exec that returns at once) and wait for them."""
    box.write_file("/tmp/service.py", SERVICE)
    assert box.exec(f"nohup python3 /tmp/service.py {PORT} >/tmp/service.log 2>&1 &").exit_code == 0
    deadline = time.monotonic() + 20
    while True:
        try:
            box.http("/ready", port=PORT, method="GET", timeout=2)
            box.http("/interim", port=RAW_PORT, method="GET", timeout=2)
            return
        except AgentError:
            if time.monotonic() > deadline:
                raise AssertionError(box.exec("cat /tmp/service.log").output) from None
            time.sleep(0.05)


@pytest.fixture(scope="module")
def box(client, base_image):
    with client.create(base_image, network="blocked") as box:
        start_service(box)
        yield box


def seen(answer: HttpAnswer) -> dict:
    """What the mock service saw of the request (its echo)."""
    assert answer.status == 200, answer
    return answer.json()


# -- straight to the agent -----------------------------------------------------------------


def test_get_and_post_with_json_round_trip(box):
    got = box.http("/notes/list?folder=inbox", port=PORT, method="GET")
    echo = seen(got)
    assert (echo["method"], echo["path"], echo["body"], echo["peer"]) == (
        "GET",
        "/notes/list?folder=inbox",
        "",
        "127.0.0.1",
    )
    assert echo["headers"]["Host"] == f"127.0.0.1:{PORT}" and echo["headers"]["Connection"] == "close"
    assert got.headers["content-type"] == "application/json" and not got.truncated and got.duration > 0
    assert got.headers["set-cookie"] == "b=2"  # the last one wins in the dict; every line is kept in order
    assert [value for name, value in got.raw_headers if name == "Set-Cookie"] == ["a=1", "b=2"]

    posted = box.http("/mail/send", port=PORT, json={"to": "bob", "text": "héllo"}, headers={"X-Tool": "mail"})
    echo = seen(posted)
    assert echo["method"] == "POST" and json.loads(echo["body"].encode("latin-1")) == {"to": "bob", "text": "héllo"}
    assert echo["headers"]["Content-Type"] == "application/json" and echo["headers"]["X-Tool"] == "mail"

    raw = seen(box.http("/upload", port=PORT, method="put", body=bytes(range(256))))
    assert raw["method"] == "PUT" and raw["body"].encode("latin-1") == bytes(range(256))
    with pytest.raises(InvalidRequest, match="not both"):
        box.http("/x", port=PORT, json={}, body=b"")


def test_statuses_pass_through_as_answers(box):
    for status in (404, 500, 201):
        answer = box.http(f"/status/{status}", port=PORT, method="GET")
        assert (answer.status, answer.json()) == (status, {"error": "as asked"})
    head = box.http("/status/404", port=PORT, method="HEAD")
    assert (head.status, head.body, head.headers["content-length"]) == (404, b"", "21")


def test_nothing_listening_is_a_clear_error(box):
    with pytest.raises(AgentError, match=r"^HTTP 502: nothing listens on 127\.0\.0\.1:9 in the sandbox$"):
        box.http("/", port=9)


def test_max_bytes_truncates_whatever_the_framing(box):
    answer = box.http("/bytes/5000", port=PORT, method="GET", max_bytes=1000)
    assert (answer.body, answer.truncated) == (b"x" * 1000, True)
    assert box.http("/bytes/5000", port=PORT, method="GET", max_bytes=5000).truncated is False
    chunked = box.http("/chunked", port=RAW_PORT, method="GET", max_bytes=7)
    assert (chunked.body, chunked.truncated) == (b"hello w", True)
    unframed = box.http("/unframed", port=RAW_PORT, method="GET", max_bytes=100)
    assert (unframed.body, unframed.truncated) == (b"y" * 100, True)
    assert box.http("/bytes/10", port=PORT, method="GET", max_bytes=0).body == b""
    with pytest.raises(InvalidRequest, match="max_bytes"):
        box.http("/", port=PORT, max_bytes=(16 << 20) + 1)


def test_chunked_unframed_and_interim_answers_are_read_whole(box):
    assert box.http("/chunked", port=RAW_PORT, method="GET").body == b"hello world"
    unframed = box.http("/unframed", port=RAW_PORT, method="GET")
    assert (unframed.body, unframed.truncated, unframed.headers["x-framing"]) == (b"y" * 3000, False, "none")
    interim = box.http("/interim", port=RAW_PORT, method="GET")
    assert (interim.status, interim.body) == (200, b"ok")


def test_a_service_that_is_not_http_cut_short_or_silent_is_an_agent_error(box):
    with pytest.raises(AgentError, match=r"127\.0\.0\.1:8081 in the sandbox answered something that is not HTTP"):
        box.http("/garbage", port=RAW_PORT, method="GET")
    with pytest.raises(AgentError, match=r"hung up in the middle of its body \(9 of 100 bytes\)"):
        box.http("/cut", port=RAW_PORT, method="GET")
    started = time.monotonic()
    with pytest.raises(AgentError, match=r"^HTTP 504: the service on 127\.0\.0\.1:8081 did not answer in 1 s$"):
        box.http("/silent", port=RAW_PORT, method="GET", timeout=1)
    assert time.monotonic() - started < 5


def raw_http(box, **fields) -> dict:
    """POST /http to the sandbox's real agent with a hand-made body, past the SDK's own checks."""
    body = {"port": PORT, "path": "/", **fields}
    return send(box._http, Call("POST", "/http", lambda r: r.json(), json=body))


@pytest.mark.parametrize(
    ("fields", "refusal"),
    [
        ({"path": "http://1.2.3.4/"}, "path must be a string starting with /"),
        ({"path": "1.2.3.4:80/"}, "path must be a string starting with /"),
        ({"path": "//evil.example/x"}, "path must not start with //"),
        ({"path": "/ HTTP/1.1\r\nHost: 1.2.3.4\r\n\r\nGET /"}, "printable ASCII without spaces"),
        ({"host": "1.2.3.4"}, "unknown field: host"),
        ({"address": "1.2.3.4"}, "unknown field: address"),
        ({"headers": {"Host": "1.2.3.4"}}, "the agent sets Host itself"),
        ({"headers": {"X-A": "b\r\nHost: 1.2.3.4"}}, "without CR, LF or NUL"),
        ({"headers": {"Transfer-Encoding": "chunked"}}, "the agent sets Transfer-Encoding itself"),
        ({"port": 0}, "port must be an integer from 1 to 65535"),
        ({"port": True}, "port must be an integer from 1 to 65535"),
        ({"method": "CONNECT"}, "method must be one of"),
        ({"timeout": 601}, "timeout must be at most 600"),
    ],
    ids=[
        "url",
        "authority",
        "double-slash",
        "crlf-path",
        "host",
        "address",
        "host-header",
        "crlf-header",
        "te",
        "port-0",
        "bool",
        "connect",
        "timeout",
    ],
)
def test_the_agent_refuses_requests_that_could_leave_its_loopback(box, fields, refusal):
    with pytest.raises(InvalidRequest, match=refusal):
        raw_http(box, **fields)


def test_only_the_sandboxs_loopback_is_reached(box):
    with pytest.raises(InvalidRequest, match="path must start with /"):
        box.http("http://1.2.3.4/", port=PORT)
    with pytest.raises(InvalidRequest, match="Host is set by the agent"):
        box.http("/", port=PORT, headers={"Host": "1.2.3.4"})
    with pytest.raises(InvalidRequest, match="path must not start with // "):  # an authority, as a URL parser reads it
        box.http("//evil.example/x", port=PORT, method="GET")
    echo = seen(box.http("/a//1.2.3.4/x", port=PORT, method="GET"))  # further on, // is part of a path
    assert echo["peer"] == "127.0.0.1" and echo["headers"]["Host"] == f"127.0.0.1:{PORT}"
    assert echo["path"] == "/a//1.2.3.4/x"


def test_the_async_sandbox_calls_the_same_service(client, box):
    endpoint = client._manager.get(box.id).endpoint

    async def run() -> tuple[HttpAnswer, HttpAnswer]:
        channel = async_agent_http(endpoint)
        handle = AsyncSandbox(box.id, "", channel, AgentCalls(), lambda _id: asyncio.sleep(0))
        try:
            posted = await handle.http("/todo/create", port=PORT, json={"title": "buy milk"})
            missing = await handle.http("/status/404", port=PORT, method="GET")
            with pytest.raises(AgentError, match="nothing listens"):
                await handle.http("/", port=9)
            return posted, missing
        finally:
            await channel.aclose()

    posted, missing = asyncio.run(run())
    assert json.loads(seen(posted)["body"]) == {"title": "buy milk"} and missing.status == 404


# -- through `orchard up` ------------------------------------------------------------------


def test_through_the_service(service, base_image):
    url, key = service
    with Client(url=url, api_key=key) as remote, remote.create(base_image) as box:
        start_service(box)
        echo = seen(box.http("/calendar/events", port=PORT, json={"day": "monday"}))
        assert json.loads(echo["body"]) == {"day": "monday"} and echo["headers"]["Content-Type"] == "application/json"
        got = box.http("/calendar/events?day=monday", port=PORT, method="GET")
        assert seen(got)["path"] == "/calendar/events?day=monday"
        assert [value for name, value in got.raw_headers if name == "Set-Cookie"] == ["a=1", "b=2"]
        assert box.http("/status/500", port=PORT, method="GET").status == 500
        truncated = box.http("/bytes/5000", port=PORT, method="GET", max_bytes=10)
        assert (truncated.body, truncated.truncated) == (b"x" * 10, True)
        with pytest.raises(AgentError, match=r"^HTTP 502: nothing listens on 127\.0\.0\.1:9 in the sandbox$"):
            box.http("/", port=9)
        with pytest.raises(AgentError, match="did not answer in 1 s"):
            box.http("/silent", port=RAW_PORT, method="GET", timeout=1)
        with httpx.Client(base_url=url, headers={"X-API-Key": key}) as http:
            refused = http.post(f"/sandboxes/{box.id}/http", json={"port": PORT, "path": "http://1.2.3.4/"})
            assert refused.status_code == 400 and "path must start with /" in refused.json()["detail"]
            refused = http.post(f"/sandboxes/{box.id}/http", json={"port": PORT, "path": "/", "host": "1.2.3.4"})
            assert refused.status_code == 200  # extra fields are ignored, as everywhere in the API: no host is used
            assert (
                refused.json()["status"] == 200 and "1.2.3.4" not in base64.b64decode(refused.json()["body"]).decode()
            )


# -- a hostile agent -----------------------------------------------------------------------


class ForgingAgent:
    """A loopback double of a hostile agent: it reads one request per connection and answers with
    `answer` (the bytes of a whole HTTP answer, or a callable that writes to the connection),
    counting what it got to send before the host hung up. Every route gets the same answer."""

    def __init__(self, folder: Path, answer: bytes | Callable[[socket.socket, ForgingAgent], None]):
        self.answer, self.sent = answer, 0
        self.served = threading.Event()
        path = str(folder / f"forger-{len(list(folder.glob('*.sock')))}.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        self.endpoint = AgentEndpoint(uds=path, token="t")
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    if callable(self.answer):
                        self.answer(conn, self)
                    else:
                        conn.sendall(self.answer)
                except OSError:
                    pass
            self.served.set()

    def sandbox(self) -> Sandbox:
        return Sandbox("forged", "", AgentChannel(self.endpoint), AgentCalls(), lambda _id: None)


@pytest.fixture
def forger(tmp_path):
    made: list[ForgingAgent] = []

    def make(answer) -> ForgingAgent:
        made.append(ForgingAgent(tmp_path, answer))
        return made[-1]

    yield make
    for agent in made:
        agent.listener.close()


def forged(answer: dict | bytes) -> bytes:
    body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


GOOD = {
    "status": 200,
    "headers": [["Content-Type", "text/plain"]],
    "body": "aGk=",
    "truncated": False,
    "duration": 0.01,
}


def test_a_well_formed_forged_answer_parses(forger):
    """The double speaks the agent's answer well enough: what the next test refuses is only the forgery."""
    answer = forger(forged(GOOD)).sandbox().http("/", port=PORT)
    assert (answer.status, answer.headers, answer.body, answer.text) == (
        200,
        {"content-type": "text/plain"},
        b"hi",
        "hi",
    )


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ({**GOOD, "status": 99999}, "status 99999, not an HTTP status"),
        ({**GOOD, "status": 99}, "status 99, not an HTTP status"),
        ({**GOOD, "status": "200"}, "not an HTTP status"),
        ({**GOOD, "status": True}, "not an HTTP status"),
        ({**GOOD, "headers": {"Content-Type": "text/plain"}}, "not a list of"),
        ({**GOOD, "headers": [["Content-Type"]]}, "not a \\[name, value\\] pair"),
        ({**GOOD, "headers": [["X-A", 1]]}, "not a \\[name, value\\] pair"),
        ({**GOOD, "headers": ["X-A: b"]}, "not a \\[name, value\\] pair"),
        ({**GOOD, "headers": [["X-A", "b\r\nSet-Cookie: x"]]}, "malformed header"),
        ({**GOOD, "headers": [["X A", "b"]]}, "malformed header"),
        ({**GOOD, "headers": [["X-A", "b"]] * 201}, "201 headers, over 200"),
        ({**GOOD, "headers": [["X-A", "b" * 40000]] * 2}, "over 65536 bytes of headers"),
        ({**GOOD, "body": "not base64!"}, "not valid base64"),
        ({**GOOD, "body": "aGk"}, "not valid base64"),
        ({**GOOD, "body": 123}, "not a base64 string"),
        ({**GOOD, "body": base64.b64encode(b"x" * 1001).decode()}, "over max_bytes=1000"),
        ({**GOOD, "truncated": "no"}, "truncated 'no'"),
        ({**GOOD, "duration": -1}, "duration -1"),
        ({k: v for k, v in GOOD.items() if k != "status"}, "status None"),
        (b"[200]", "not a JSON object"),
        (b"not json", "not JSON"),
        ({**GOOD, "duration": float("nan")}, "duration nan"),
    ],
)
def test_forged_answers_are_agent_errors(forger, answer, error):
    box = forger(forged(answer)).sandbox()
    with pytest.raises(AgentError, match=error) as caught:
        box.http("/", port=PORT, max_bytes=1000)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


DEEP = b"[" * 200_000
"""JSON nested deeper than Python's parser recurses: `json.loads` raises RecursionError on it."""


def forged_status(status: int, body: bytes) -> bytes:
    return b"HTTP/1.1 %d Oops\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


@pytest.mark.parametrize(
    ("answer", "call", "error"),
    [
        (forged(DEEP), lambda box: box.http("/", port=PORT), "the answer to an HTTP call is not JSON"),
        (forged(DEEP), lambda box: box.list_files("/"), "malformed answer to GET /files/list: RecursionError"),
        (forged(DEEP[:60_000] + b"\n"), lambda box: box.exec("true"), "does not start with a JSON line of facts"),
        (forged_status(500, DEEP), lambda box: box.list_files("/"), r"^HTTP 500: \[\[\["),
        (forged_status(500, b"[1]"), lambda box: box.list_files("/"), r"^HTTP 500: \[1\]$"),
    ],
    ids=["http", "other-call", "exec-line", "error-answer", "error-not-an-object"],
)
def test_deeply_nested_json_from_the_agent_is_an_agent_error(forger, answer, call, error):
    """JSON nested too deeply to parse (or an error answer that is JSON but no object) is a malformed
    answer like any other: an AgentError, never a RecursionError or AttributeError out of the SDK."""
    with pytest.raises(AgentError, match=error):
        call(forger(answer).sandbox())


def test_a_deeply_nested_body_is_a_value_error_of_its_json(forger):
    """`HttpAnswer.json()` says ValueError for a body it cannot parse, so `except ValueError` holds
    for a service that nests its JSON too deeply as for one that sends no JSON."""
    body = base64.b64encode(DEEP).decode()
    answer = forger(forged({**GOOD, "body": body})).sandbox().http("/", port=PORT)
    assert answer.body == DEEP
    with pytest.raises(ValueError, match="nested too deeply"):
        answer.json()


def test_a_claimed_100_mb_answer_is_refused_before_it_is_read(forger):
    def flood(conn: socket.socket, agent: ForgingAgent) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
        zeros = bytes(1 << 16)
        while agent.sent < 100_000_000:
            agent.sent += conn.send(zeros)

    agent = forger(flood)
    with pytest.raises(AgentError, match="the sandbox broke its bound: the answer to POST /http is 100000000 bytes"):
        agent.sandbox().http("/", port=PORT, max_bytes=1000)
    assert agent.served.wait(30)
    assert agent.sent < 16 * 1024 * 1024  # it stopped once the host hung up


def test_the_async_sandbox_refuses_forged_answers_too(forger):
    agent = forger(forged({**GOOD, "status": 99999}))

    async def run() -> None:
        channel = AsyncAgentChannel(agent.endpoint)
        box = AsyncSandbox("forged", "", channel, AgentCalls(), lambda _id: asyncio.sleep(0))
        try:
            with pytest.raises(AgentError, match="not an HTTP status"):
                await box.http("/", port=PORT)
        finally:
            await channel.aclose()

    asyncio.run(run())

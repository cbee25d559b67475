"""`orchard proxy` between real clients (httpx, the OpenAI client, litellm under mini-swe-agent) and a
real OpenAI-compatible upstream on loopback: the standard library's HTTP server in a thread,
answering as a script says, streams in chunks with pauses, tool-call deltas, a usage chunk, and
log-probs with token ids as vLLM sends them. The store is a real SQLite file."""

from __future__ import annotations

import http.client as http_client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from hostile_http import MiB, send_chunked
from sqlmodel import col, select
from typer.testing import CliRunner

from orchard.cli import app
from orchard.proxy.recorder import StreamAssembler, sse_events
from orchard.proxy.server import Proxy, parse_target
from orchard.store import RunRecord, StepRecord, Store, TrajectoryRecord, session
from orchard.store.tables import ProxyCallRecord

MODEL = "tiny-upstream"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def bash_call(call_id: str, command: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }


@dataclass
class Reply:
    """What the upstream answers one chat call with."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    """Another status answers `{"error": ...}` with it."""
    hang: float = 0.0
    """Seconds to wait before answering."""
    stream_end: str = "done"
    """How a stream ends: `done` (its `[DONE]`), `cut` (no `[DONE]`), `error` (an error event, then `[DONE]`)."""


def token_of(index: int) -> int:
    return 1000 + index


@dataclass
class Upstream:
    """A scripted OpenAI-compatible server: `script(body)` says what each chat call gets."""

    script: Callable[[dict[str, Any]], Reply]
    url: str = ""
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    """(method, path, headers, JSON body) of every request, in order."""
    hold: threading.Event | None = None
    """When given, a stream waits on it before its last chunks (its finish and usage)."""
    finished_streams: int = 0

    def chats(self) -> list[dict[str, Any]]:
        return [body for _, path, _, body in self.requests if path.endswith("/chat/completions")]

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The non-stream answer: the message, vLLM's token ids and log-probs, usage."""
        reply = self.script(body)
        pieces = pieces_of(reply.content)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        logprobs = {
            "content": [
                {"token": f"token_id:{token_of(i)}", "logprob": -0.5, "bytes": None, "top_logprobs": []}
                for i in range(len(pieces))
            ]
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            "token_ids": [token_of(i) for i in range(len(pieces))],
        }
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body.get("model"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": 10 * len(body.get("messages") or []),
                "completion_tokens": len(pieces),
                "total_tokens": 0,
            },
            "prompt_token_ids": [1, 2, 3],
        }

    def chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The same answer as stream chunks: role, content pieces, tool-call deltas, finish, usage."""
        whole = self.answer(body)
        choice = whole["choices"][0]
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": whole["model"]}
        out = [
            {
                **base,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                "prompt_token_ids": [1, 2, 3],
            }
        ]
        for i, piece in enumerate(pieces_of(choice["message"]["content"] or "")):
            entry = choice["logprobs"]["content"][i]
            delta = {
                "index": 0,
                "delta": {"content": piece},
                "logprobs": {"content": [entry]},
                "finish_reason": None,
                "token_ids": [token_of(i)],
            }
            out.append({**base, "choices": [delta]})
        for index, call in enumerate(choice["message"].get("tool_calls") or []):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            first = {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": "bash", "arguments": arguments[:half]},
            }
            out.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}]})
            rest = {"index": index, "function": {"arguments": arguments[half:]}}
            out.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [rest]}, "finish_reason": None}]})
        out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            out.append({**base, "choices": [], "usage": whole["usage"]})
        return out


def pieces_of(text: str) -> list[str]:
    return [text[i : i + 4] for i in range(0, len(text), 4)]


@contextmanager
def upstream_serving(
    script: Callable[[dict[str, Any]], Reply], hold: threading.Event | None = None
) -> Iterator[Upstream]:
    """The upstream on a free loopback port (HTTP/1.1 keep-alive; streams in chunked encoding)."""
    upstream = Upstream(script, hold=hold)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def send(self, status: int, kind: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            try:
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):  # the proxy gave up on a hanging answer
                self.close_connection = True

        def do_GET(self) -> None:
            upstream.requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}, None))
            self.send(
                200,
                "application/json",
                json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode(),
            )

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
            upstream.requests.append(("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            reply = upstream.script(body)
            time.sleep(reply.hang)
            if reply.status != 200:
                error = {"error": {"message": f"scripted failure {reply.status}", "type": "server_error"}}
                return self.send(reply.status, "application/json", json.dumps(error).encode())
            if self.path.endswith("/completions") and not self.path.endswith("/chat/completions"):
                text = {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "created": 1700000000,
                    "model": body["model"],
                    "choices": [{"index": 0, "text": reply.content, "finish_reason": "stop", "logprobs": None}],
                }
                return self.send(200, "application/json", json.dumps(text).encode())
            if not body.get("stream"):
                return self.send(200, "application/json", json.dumps(upstream.answer(body)).encode())
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            chunks = upstream.chunks(body)
            for index, chunk in enumerate(chunks):
                if upstream.hold is not None and index == len(chunks) - 2:
                    assert upstream.hold.wait(timeout=10), "the client never saw the earlier chunks"
                self.chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                time.sleep(0.005)  # chunks arrive apart, as a model's tokens do
            if reply.stream_end == "error":
                self.chunk(b'data: {"error": {"message": "the engine died", "type": "server_error"}}\n\n')
            if reply.stream_end != "cut":
                self.chunk(b"data: [DONE]\n\n")
            upstream.finished_streams += 1  # before the stream's end, which the client may see at once
            self.chunk(b"")

        def chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    upstream.url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        yield upstream
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def echo(body: dict[str, Any]) -> Reply:
    """Replies that say which turn they answer; a conversation that asks for a tool gets one in its first two."""
    messages = body.get("messages") or [{}]
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    last = text_of(messages[-1].get("content"))
    if turn < 2 and any("tool please" in text_of(m.get("content")) for m in messages if m.get("role") == "user"):
        return Reply(f"turn {turn}: running it", [bash_call(f"call-{turn}", f"echo {turn}")])
    return Reply(f"turn {turn}: you said {last}")


def text_of(content: Any) -> str:
    return content if isinstance(content, str) else ""


@pytest.fixture
def store(tmp_path) -> Store:
    return Store.open(f"sqlite:///{tmp_path / 'orchard.db'}")


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with upstream_serving(echo) as served:
        yield served


@pytest.fixture
def proxy(upstream, store) -> Iterator[Proxy]:
    with Proxy(upstream.url, port=0, store=store, key=KEY, run="tests") as running:
        yield running


def calls_of(store: Store, run_id: str) -> list[ProxyCallRecord]:
    with session(store) as db:
        return list(
            db.exec(
                select(ProxyCallRecord)
                .where(ProxyCallRecord.run_id == run_id)
                .order_by(col(ProxyCallRecord.created_at))
            )
        )


def trajectories_of(store: Store, run_id: str) -> list[tuple[TrajectoryRecord, list[StepRecord]]]:
    with session(store) as db:
        found = list(
            db.exec(
                select(TrajectoryRecord)
                .where(TrajectoryRecord.run_id == run_id)
                .order_by(col(TrajectoryRecord.created_at))
            )
        )
        return [
            (
                t,
                list(
                    db.exec(select(StepRecord).where(StepRecord.trajectory_id == t.id).order_by(col(StepRecord.index)))
                ),
            )
            for t in found
        ]


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "tools": TOOLS}
KEY = "sk-x"
"""The key the tests' proxies answer (the OpenAI clients here send it)."""
KEYED = {"authorization": f"Bearer {KEY}"}


# -- forwarding ----------------------------------------------------------------------------------


def test_answers_through_the_proxy_are_the_upstreams_byte_for_byte(upstream, proxy):
    """Non-stream and stream, chat and completions, and the model list: the same bytes as straight from
    the upstream; the client's headers go along (not its key), with the upstream's Host and no compression asked for."""
    stream = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=10, headers=KEYED) as http:
        for path, body in (
            ("/chat/completions", CHAT),
            ("/chat/completions", stream),
            ("/completions", {"model": MODEL, "prompt": "hi"}),
        ):
            direct = http.post(
                upstream.url + path, json=body, headers={"x-client": "mine", "authorization": "Bearer sk-client"}
            )
            through = http.post(proxy.url + path, json=body, headers={"x-client": "mine", **KEYED})
            assert (through.status_code, through.content) == (direct.status_code, direct.content)
            assert through.headers["content-type"] == direct.headers["content-type"]
        assert http.get(proxy.url + "/models", headers=KEYED).content == http.get(upstream.url + "/models").content
    forwarded = upstream.requests[1][2]
    assert forwarded["x-client"] == "mine" and "authorization" not in forwarded  # the proxy's key stays here
    assert forwarded["accept-encoding"] == "identity" and forwarded["host"] == upstream.url.split("/")[2]
    assert upstream.requests[1][3] == CHAT  # the body unchanged


def test_the_openai_client_gets_the_same_answers_through_the_proxy(upstream, proxy):
    from openai import OpenAI

    direct, through = OpenAI(base_url=upstream.url, api_key="sk-x"), OpenAI(base_url=proxy.url, api_key="sk-x")
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "tool please"}], "tools": TOOLS}
    assert through.chat.completions.create(**ask).model_dump() == direct.chat.completions.create(**ask).model_dump()
    streamed = [
        c.model_dump()
        for c in through.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    ]
    assert streamed == [
        c.model_dump()
        for c in direct.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    ]
    assert streamed[-1]["usage"]["completion_tokens"] == 5
    assert [m.id for m in through.models.list()] == [MODEL]


def test_a_stream_is_relayed_as_it_arrives_not_when_it_ends(store):
    """The upstream holds its last content chunk until the client has seen the earlier ones: a proxy
    that gathered the answer first would never pass them on, and the client would time out."""
    hold = threading.Event()
    with (
        upstream_serving(lambda body: Reply("one two three four five six"), hold=hold) as upstream,
        Proxy(upstream.url, port=0, store=store, key=KEY) as proxy,
    ):
        body = {**CHAT, "stream": True}
        seen: list[str] = []
        with (
            httpx.Client(timeout=httpx.Timeout(5.0), headers=KEYED) as http,
            http.stream("POST", proxy.url + "/chat/completions", json=body) as answer,
        ):
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    seen.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
                    if len(seen) == 3:
                        assert upstream.finished_streams == 0
                        hold.set()
        assert upstream.finished_streams == 1 and "".join(seen) == "one two three four five six"
        proxy.flush()
        (call,) = calls_of(store, "proxy-default")
        assert call.stream and call.status == "ok"
        assert json.loads(call.answer)["choices"][0]["message"]["content"] == "one two three four five six"


def test_an_api_key_from_the_environment_replaces_the_clients(upstream, store):
    with Proxy(upstream.url, port=0, store=store, key=KEY, api_key="sk-upstream") as proxy:
        httpx.post(proxy.url + "/chat/completions", json=CHAT, headers=KEYED, timeout=10)
    (_, _, headers, _) = upstream.requests[-1]
    assert headers["authorization"] == "Bearer sk-upstream"


# -- what is recorded ----------------------------------------------------------------------------


def test_interleaved_conversations_become_one_trajectory_each_by_tag_and_prefix(upstream, proxy, store):
    """Conversation A (three calls, tool calls and results) and C (another question) on sandbox s1, B on
    s2, their calls interleaved, some streamed: three trajectories, each with its own steps."""
    from openai import OpenAI

    s1, s2 = (OpenAI(base_url=proxy.tagged("exp", box), api_key="sk-x") for box in ("s1", "s2"))

    def ask(client: Any, messages: list[dict[str, Any]], stream: bool = False) -> dict[str, Any]:
        """The answer's message as the client would send it back (a stream's put together)."""
        if not stream:
            answer = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
            return answer.choices[0].message.model_dump(exclude_none=True)
        said: dict[str, Any] = {"role": "assistant", "content": ""}
        calls: dict[int, dict[str, Any]] = {}
        for chunk in client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, stream=True):
            for choice in chunk.choices:
                said["content"] += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    merged = calls.setdefault(
                        call.index, {"id": call.id, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    merged["function"]["name"] += call.function.name or ""
                    merged["function"]["arguments"] += call.function.arguments or ""
        return {**said, "tool_calls": list(calls.values())} if calls else said

    a = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tool please"}]
    b = [{"role": "user", "content": "hi from b"}]
    c = [{"role": "user", "content": "tool please"}]  # on s1 like A, but another conversation
    a.append(ask(s1, a))
    b.append(ask(s2, b, stream=True))
    a += [{"role": "tool", "tool_call_id": a[-1]["tool_calls"][0]["id"], "content": "OBSERVED 0"}]
    c.append(ask(s1, c))
    a.append(ask(s1, a, stream=True))
    b += [{"role": "user", "content": "again"}]
    b.append(ask(s2, b))
    a += [
        {"role": "tool", "tool_call_id": a[-1]["tool_calls"][0]["id"], "content": "OBSERVED 1"},
        {"role": "user", "content": "done?"},
    ]
    a.append(ask(s1, a))
    proxy.flush()
    recorded = trajectories_of(store, "proxy-exp")
    by_first = {(t.instance_id, json.loads(t.messages)[0]["content"]): (t, steps) for t, steps in recorded}
    assert sorted(by_first) == [("s1", "be brief"), ("s1", "tool please"), ("s2", "hi from b")]
    trajectory, steps = by_first["s1", "be brief"]
    assert json.loads(trajectory.messages) == a  # the last request's messages and the last answer
    assert json.loads(trajectory.tools) == TOOLS and trajectory.harness == "proxy" and trajectory.model == MODEL
    assert [s.reply for s in steps] == ["turn 0: running it", "turn 1: running it", "turn 2: you said done?"]
    assert json.loads(steps[0].actions) == [{"name": "bash", "arguments": {"command": "echo 0"}}]
    assert [s.observation for s in steps] == ["OBSERVED 0", "OBSERVED 1\ndone?", ""]
    assert [s.finish_reason for s in steps] == ["tool_calls", "tool_calls", "stop"]
    assert trajectory.steps == 3 and trajectory.completion_tokens == sum(s.completion_tokens for s in steps) > 0
    assert [s.reply for s in by_first["s2", "hi from b"][1]] == ["turn 0: you said hi from b", "turn 1: you said again"]
    assert len(by_first["s1", "tool please"][1]) == 1
    calls = calls_of(store, "proxy-exp")
    assert len(calls) == 6 and {c.sandbox for c in calls} == {"s1", "s2"} and all(c.status == "ok" for c in calls)
    assert [c.step for c in calls if c.trajectory_id == trajectory.id] == [0, 1, 2]


def test_token_ids_and_logprobs_are_kept_from_streams_and_whole_answers(upstream, proxy, store):
    with httpx.Client(timeout=10, headers=KEYED) as http:
        http.post(proxy.url + "/chat/completions", json=CHAT)
        http.post(
            proxy.url + "/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        )
    proxy.flush()
    whole, streamed = calls_of(store, "proxy-tests")
    assert not whole.stream and streamed.stream
    tokens = [token_of(i) for i in range(len(pieces_of("turn 0: you said hello")))]
    for call in (whole, streamed):
        assert json.loads(call.token_ids) == {"prompt": [1, 2, 3], "completion": tokens}
        assert [e["token"] for e in json.loads(call.logprobs)["content"]] == [f"token_id:{t}" for t in tokens]
        assert (call.prompt_tokens, call.completion_tokens, call.model) == (10, len(tokens), MODEL)
        assert json.loads(call.request)["messages"] == CHAT["messages"]
    assert (
        json.loads(streamed.answer)["choices"][0]["message"]["content"]
        == json.loads(whole.answer)["choices"][0]["message"]["content"]
    )


def test_stream_chunks_assemble_into_the_answer_the_same_call_gives_whole():
    """Tool-call deltas (the id and name first, the arguments in pieces) merge back into the calls."""
    upstream = Upstream(lambda body: Reply("ok, running", [bash_call("c1", "ls -la"), bash_call("c2", "pwd")]))
    body = {**CHAT, "stream_options": {"include_usage": True}}
    assembler = StreamAssembler()
    for chunk in upstream.chunks(body):
        assembler.feed(chunk)
    whole, assembled = upstream.answer(body), assembler.answer()
    assert assembled["choices"][0]["message"] == {**whole["choices"][0]["message"]}
    for key in ("finish_reason", "logprobs", "token_ids"):
        assert assembled["choices"][0][key] == whole["choices"][0][key]
    assert assembled["usage"] == whole["usage"] and assembled["prompt_token_ids"] == [1, 2, 3]
    text = 'event: x\ndata: {"a": 1}\n\n: comment\n\ndata: not json\n\ndata: [DONE]\n\ndata: {"b": 2}\n\n'
    assert list(sse_events(text)) == [{"a": 1}]


def test_calls_written_together_continue_each_other_and_token_ids_come_from_logprobs(store, capsys):
    """A batch (the calls that waited together) is one transaction in which a call may continue the
    trajectory of the call just before it; a call the store refuses costs only itself (the batch
    is written again call by call); token ids are read from vLLM's `token_id:N` log-probs."""
    from orchard.proxy.recorder import Call, Writer, token_ids

    upstream = Upstream(echo)
    first = {**CHAT, "messages": [{"role": "user", "content": "tool please"}]}
    answer = upstream.answer(first)
    second = {
        **first,
        "messages": [*first["messages"], answer["choices"][0]["message"], {"role": "tool", "content": "OUT"}],
    }

    def call(body: dict[str, Any]) -> Call:
        return Call(
            "batch",
            "box",
            "/v1/chat/completions",
            json.dumps(body).encode(),
            time.time(),
            0.1,
            200,
            json.dumps(upstream.answer(body)).encode(),
            False,
        )

    writer = Writer(store, "batch")
    refused = call(CHAT)
    refused.duration = float("nan")  # SQLite stores NaN as NULL, into a NOT NULL column
    writer.write([call(first), refused, call(second)])
    ((trajectory, steps),) = trajectories_of(store, "proxy-batch")
    assert trajectory.steps == 2 and steps[0].observation == "OUT" and trajectory.instance_id == "box"
    assert len(calls_of(store, "proxy-batch")) == 2
    (told,) = capsys.readouterr().err.splitlines()
    assert told.startswith("orchard proxy: could not record a call to /v1/chat/completions: ")
    said = upstream.answer(second)["choices"][0]["message"]
    writer.write([call({**second, "messages": [*second["messages"], said, {"role": "user", "content": "on"}]})])
    assert [t.steps for t, _ in trajectories_of(store, "proxy-batch")] == [3]  # the index held: it went on
    del answer["choices"][0]["token_ids"], answer["prompt_token_ids"]
    assert token_ids(answer) == {"prompt": None, "completion": [1000, 1001, 1002, 1003, 1004]}
    assert token_ids({"choices": [{"message": {}}]}) is None


def test_upstream_failures_pass_through_and_are_recorded_as_failed_calls(store):
    def script(body: dict[str, Any]) -> Reply:
        said = body["messages"][-1]["content"]
        return Reply(status=503) if said == "fail" else Reply(hang=3.0) if said == "hang" else Reply("fine")

    with upstream_serving(script) as upstream, Proxy(upstream.url, port=0, store=store, key=KEY, timeout=1.0) as proxy:
        failing = {**CHAT, "messages": [{"role": "user", "content": "fail"}]}
        refused = httpx.post(proxy.url + "/chat/completions", json=failing, headers=KEYED, timeout=10)
        assert (refused.status_code, refused.content) == (
            503,
            httpx.post(upstream.url + "/chat/completions", json=failing).content,
        )
        late = httpx.post(
            proxy.url + "/chat/completions",
            headers=KEYED,
            json={**CHAT, "messages": [{"role": "user", "content": "hang"}]},
            timeout=10,
        )
        assert (
            late.status_code == 504
            and late.json()["error"]["message"]
            == f"the upstream {upstream.url.removesuffix('/v1')} sent nothing for 1 s"
        )
        proxy.flush()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = s.getsockname()[1]
    with Proxy(f"http://127.0.0.1:{gone}/v1", port=0, store=store, key=KEY, run="gone") as proxy:
        down = httpx.post(proxy.url + "/chat/completions", json=CHAT, headers=KEYED, timeout=10)
    error = down.json()["error"]
    assert down.status_code == 502 and error["type"] == "upstream_unreachable" and "\n" not in error["message"]
    assert error["message"].startswith(f"the upstream http://127.0.0.1:{gone} cannot be reached: ")
    failed, timed_out = calls_of(store, "proxy-default")
    assert (failed.status, failed.http_status, failed.error) == ("failed", 503, "the upstream answered HTTP 503")
    assert json.loads(failed.answer)["error"]["message"] == "scripted failure 503"
    assert (timed_out.status, timed_out.http_status) == ("failed", None) and "sent nothing for 1 s" in timed_out.error
    (unreached,) = calls_of(store, "proxy-gone")
    assert unreached.status == "failed" and "cannot be reached" in unreached.error
    assert trajectories_of(store, "proxy-default") == [] and trajectories_of(store, "proxy-gone") == []


def test_a_stream_that_fails_upstream_fails_for_the_client_and_in_the_record(store):
    """A stream that ends without its `[DONE]`, or carries an error event, ends for the client in an
    error the OpenAI client raises, and is recorded as a failed call (it was `ok`, with no choices)."""
    import openai

    def script(body: dict[str, Any]) -> Reply:
        return Reply("half an answer", stream_end=body["messages"][-1]["content"])

    with upstream_serving(script) as upstream, Proxy(upstream.url, port=0, store=store, key=KEY) as proxy:
        chat = openai.OpenAI(base_url=proxy.url, api_key="sk-x").chat.completions
        for end in ("cut", "error"):
            with pytest.raises(openai.APIError):
                list(chat.create(model=MODEL, messages=[{"role": "user", "content": end}], stream=True))
        assert len(list(chat.create(model=MODEL, messages=[{"role": "user", "content": "done"}], stream=True))) > 1
        proxy.flush()
    cut, errored, done = calls_of(store, "proxy-default")
    assert (cut.status, cut.error) == ("failed", "the upstream's stream ended before its [DONE]")
    assert (errored.status, errored.error) == ("failed", "the upstream sent an error in its stream")
    assert (done.status, done.error) == ("ok", None)


def test_bodies_over_the_limits_are_refused_and_recorded_failed(store):
    """A request body over `max_request` is refused (413) however it is sent, and never forwarded;
    an answer over `max_answer` is dropped, whole or streamed, and its call recorded failed."""
    import openai

    with (
        upstream_serving(lambda _body: Reply("x" * 4000)) as upstream,
        Proxy(upstream.url, port=0, store=store, key=KEY, max_request=2048, max_answer=1024) as proxy,
    ):
        big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "y" * 4096}]}).encode()
        declared = httpx.post(proxy.url + "/chat/completions", content=big, headers=KEYED)
        chunked = httpx.post(proxy.url + "/chat/completions", content=iter([big[:1000], big[1000:]]), headers=KEYED)
        assert declared.status_code == chunked.status_code == 413 and upstream.chats() == []
        assert declared.json()["error"]["message"] == "the request's body is over the proxy's limit of 2048 bytes"
        whole = httpx.post(proxy.url + "/chat/completions", json=CHAT, headers=KEYED)
        assert whole.status_code == 502 and whole.json()["error"]["type"] == "upstream_too_large"
        chat = openai.OpenAI(base_url=proxy.url, api_key="sk-x").chat.completions
        with pytest.raises(openai.APIError, match="over the proxy's limit of 1024 bytes"):
            list(chat.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True))
        proxy.flush()
    over = "the upstream's answer is over the proxy's limit of 1024 bytes"
    assert [(c.status, c.error) for c in calls_of(store, "proxy-default")] == [("failed", over)] * 2


def test_no_key_a_client_sends_reaches_the_upstream_or_the_store(upstream, store, tmp_path):
    """Keys in a client's headers (OpenAI's Authorization, Anthropic's x-api-key, Azure's api-key),
    the proxy's included, go no further: the upstream gets only the proxy's own upstream key, and
    no table of the store holds them, the raw file neither."""
    secret = "sk-secret-proxy"
    with Proxy(upstream.url, port=0, store=store, key=secret, api_key="sk-upstream") as proxy:
        for stream, header in ((False, "authorization"), (True, "x-api-key"), (False, "api-key")):
            sent = {header: f"Bearer {secret}" if header == "authorization" else secret, "x-api-key-2": "fine"}
            extra = {"api-key": "sk-secret-azure"} if header != "api-key" else {"x-api-key": "sk-secret-x"}
            answer = httpx.post(proxy.url + "/chat/completions", json={**CHAT, "stream": stream}, headers=sent | extra)
            assert answer.status_code == 200
        proxy.flush()
    for _method, _path, headers, _body in upstream.requests:
        assert not any("sk-secret" in value for value in headers.values())
        assert headers["authorization"] == "Bearer sk-upstream" and headers["x-api-key-2"] == "fine"
    assert len(calls_of(store, "proxy-default")) == 3
    stored = b"".join(path.read_bytes() for path in tmp_path.glob("orchard.db*"))  # the WAL too
    assert b"tiny-upstream" in stored and b"sk-secret" not in stored  # the calls are there, their keys not


def test_no_answer_without_the_key_and_a_huge_body_without_it_is_never_read(upstream, proxy, store):
    """Whoever reaches the proxy (a sandbox, through `expose`) must hold its key, or an attempt's,
    in any of the three headers: without one, 401 before a byte of the body is read (an endless
    body sent without a key is answered at once) and nothing goes upstream. An attempt's key
    records under its own run and sandbox, whatever the path names."""
    url = proxy.url + "/chat/completions"
    for headers in ({}, {"authorization": "Bearer sk-wrong"}, {"x-api-key": "sk-wrong"}, {"authorization": KEY[:-1]}):
        refused = httpx.post(url, json=CHAT, headers=headers, timeout=10)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    status, sent = send_chunked(proxy.port, "/v1/chat/completions", {}, 1 << 30)  # 1 GiB, without a key
    assert status == 401 and sent < 64 * MiB, f"the proxy read {sent / MiB:.0f} MiB"  # the kernel's buffers
    assert upstream.requests == []
    for header in ("x-api-key", "api-key"):
        assert httpx.post(url, json=CHAT, headers={header: KEY}, timeout=10).status_code == 200
    granted = proxy.keys.grant("attempt-7", "box-3")
    answer = httpx.post(
        proxy.tagged("elsewhere", "box-0") + "/chat/completions", json=CHAT, headers={"x-api-key": granted}
    )
    assert answer.status_code == 200
    proxy.keys.revoke(granted)
    assert httpx.post(url, json=CHAT, headers={"x-api-key": granted}, timeout=10).status_code == 401
    proxy.flush()
    assert [c.sandbox for c in calls_of(store, "proxy-attempt-7")] == ["box-3"] and not calls_of(
        store, "proxy-elsewhere"
    )


def test_a_bad_tag_or_path_is_refused_in_one_line_and_tags_parse(proxy, upstream, store):
    with httpx.Client(timeout=10, headers=KEYED) as http:
        bad = http.post(proxy.url.removesuffix("/v1") + "/t/bad%20tag/v1/chat/completions", json=CHAT)
        assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("bad run tag 'bad tag': ")
        dots = http.post(proxy.url.removesuffix("/v1") + "/t/run/..hidden/v1/chat/completions", json=CHAT)
        assert dots.status_code == 400 and "bad sandbox tag '..hidden'" in dots.json()["error"]["message"]
        assert http.post(proxy.url.removesuffix("/v1") + "/t/run/a/b/v1/chat/completions", json=CHAT).status_code == 400
        assert http.post(proxy.url + "/embeddings", json={}).status_code == 404
        raw = http_client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)  # httpx would resolve the dots
        raw.request("GET", "/v1/models/org/../../admin", headers=KEYED)
        assert raw.getresponse().status == 404  # the upstream key reaches no other route
        raw.close()
        assert http.get(proxy.url + "/models/org/model-1").status_code == 200
    assert [path for _, path, _, _ in upstream.requests] == ["/v1/models/org/model-1"]  # nothing refused went upstream
    assert parse_target("/v1/models", "d") == ("d", None, "/v1/models")
    assert parse_target("/t/r/v1/chat/completions", "d") == ("r", None, "/v1/chat/completions")
    assert parse_target("/t/v1/v1/completions", "d") == ("v1", None, "/v1/completions")
    assert parse_target("/t/r/box-1/v1/chat/completions", "d") == ("r", "box-1", "/v1/chat/completions")


def test_a_run_is_of_kind_proxy_and_finished_with_its_figures_when_the_proxy_stops(upstream, store):
    with Proxy(upstream.url, port=0, store=store, key=KEY, run="day1") as proxy:
        httpx.post(proxy.url + "/chat/completions", json=CHAT, headers=KEYED, timeout=10)
        httpx.post(proxy.tagged("other") + "/chat/completions", json=CHAT, headers=KEYED, timeout=10)
    with session(store) as db:
        runs = {r.id: r for r in db.exec(select(RunRecord))}
    assert sorted(runs) == ["proxy-day1", "proxy-other"]
    assert {(r.kind, r.status) for r in runs.values()} == {("proxy", "finished")}
    assert json.loads(runs["proxy-day1"].summary) == {"calls": 1, "failed_calls": 0, "trajectories": 1}
    with Proxy(upstream.url, port=0, store=store, key=KEY, run="day1") as proxy:  # restarted: the conversation goes on
        first = json.loads(trajectories_of(store, "proxy-day1")[0][0].messages)
        httpx.post(
            proxy.url + "/chat/completions",
            headers=KEYED,
            json={**CHAT, "messages": [*first, {"role": "user", "content": "more"}]},
            timeout=10,
        )
    ((trajectory, steps),) = trajectories_of(store, "proxy-day1")
    assert trajectory.steps == 2 and steps[0].observation == "more"


# -- the command ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_command_prints_its_url_serves_and_stops_cleanly_at_ctrl_c(upstream, tmp_path):
    home, port = tmp_path / "home", free_port()
    env = {**os.environ, "ORCHARD_HOME": str(home), "UPSTREAM_KEY": "sk-from-env"}
    env.pop("ORCHARD_DB_URL", None)
    command = [
        sys.executable,
        "-m",
        "orchard",
        "proxy",
        "--upstream",
        upstream.url,
        "--port",
        str(port),
        "--run",
        "cli",
        "--api-key-env",
        "UPSTREAM_KEY",
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith(
            f"orchard proxy on http://127.0.0.1:{port}/v1 -> {upstream.url}, recording run proxy-cli"
        )
        key = process.stdout.readline().removeprefix("clients send the key ").strip()  # a new one: none was given
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        assert httpx.post(url, json=CHAT, timeout=10).status_code == 401
        answer = httpx.post(url, json=CHAT, headers={"authorization": f"Bearer {key}"}, timeout=10)
        assert key.startswith("sk-orchard-") and answer.status_code == 200
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out == "" and err.strip() == "stopped; run proxy-cli holds 1 calls, 1 trajectories"
    assert upstream.requests[-1][2]["authorization"] == "Bearer sk-from-env"
    disk = Store.open(f"sqlite:///{home / 'orchard.db'}")
    assert len(calls_of(disk, "proxy-cli")) == 1
    with session(disk) as db:
        assert db.get(RunRecord, "proxy-cli").status == "finished"


def test_sigterm_ends_the_proxy_within_two_seconds_while_an_answer_hangs(tmp_path):
    """A supervisor's SIGTERM (Docker, Kubernetes, systemd) while the upstream is slow to answer:
    the proxy ends within 2 s, not after its grace for calls in flight (it was 3 s)."""
    home, port = tmp_path / "home", free_port()
    env = {**os.environ, "ORCHARD_HOME": str(home), "PROXY_KEY": KEY}
    env.pop("ORCHARD_DB_URL", None)
    with upstream_serving(lambda _body: Reply("late", hang=8.0)) as upstream:
        command = [sys.executable, "-m", "orchard", "proxy", "--upstream", upstream.url, "--port", str(port)]
        command += ["--key-env", "PROXY_KEY", "--max-request", "1", "--max-answer", "1"]  # MiB: the bounds are options
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert process.stdout.readline().startswith("orchard proxy on")
            assert process.stdout.readline() == "clients send the key in $PROXY_KEY\n"
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            call = lambda: httpx.post(url, json=CHAT, headers=KEYED, timeout=30)  # noqa: E731
            waiting = threading.Thread(target=call, daemon=True)
            waiting.start()
            deadline = time.monotonic() + 10
            while not upstream.requests and time.monotonic() < deadline:  # the call is at the upstream
                time.sleep(0.05)
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=2)
        finally:
            process.kill()


def test_a_killed_proxy_leaves_whole_records_and_its_run_interrupted(upstream, tmp_path):
    """SIGKILL: no shutdown runs at all. The recording process still writes what it was handed,
    notices its proxy is gone, marks the run interrupted and ends."""
    home, port = tmp_path / "home", free_port()
    env = {**os.environ, "ORCHARD_HOME": str(home), "PROXY_KEY": KEY}
    env.pop("ORCHARD_DB_URL", None)
    command = [sys.executable, "-m", "orchard", "proxy", "--upstream", upstream.url, "--port", str(port)]
    command += ["--key-env", "PROXY_KEY"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout.readline().startswith("orchard proxy on ")
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for _ in range(3):
            assert httpx.post(url, json=CHAT, headers=KEYED, timeout=10).status_code == 200
    finally:
        process.kill()
        process.wait()
    disk = Store.open(f"sqlite:///{home / 'orchard.db'}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with session(disk) as db:
            run = db.get(RunRecord, "proxy-default")
        if run.status != "running":
            break
        time.sleep(0.2)
    assert run.status == "interrupted"
    assert json.loads(run.summary) == {"calls": 3, "failed_calls": 0, "trajectories": 3}
    assert all(t.steps == 1 and len(steps) == 1 for t, steps in trajectories_of(disk, "proxy-default"))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--upstream", "ftp://example.com/v1"],
            "error: --upstream 'ftp://example.com/v1': give the model server's http(s) URL",
        ),
        (["--upstream", "http://"], "error: --upstream 'http://'"),
        (["--upstream", "http://127.0.0.1:8000/v1", "--run", "no/slash"], "error: --run: bad run tag 'no/slash'"),
        (
            ["--upstream", "http://127.0.0.1:8000/v1", "--api-key-env", "ORCHARD_TEST_UNSET"],
            "error: --api-key-env ORCHARD_TEST_UNSET: that environment variable is not set",
        ),
    ],
)
def test_bad_arguments_end_in_one_line_and_exit_code_1(arguments, message, orchard_home, monkeypatch):
    monkeypatch.delenv("ORCHARD_TEST_UNSET", raising=False)
    result = CliRunner().invoke(app, ["proxy", *arguments])
    assert result.exit_code == 1 and result.output.startswith(message) and result.output.count("\n") == 1, result.output


def test_a_port_in_use_ends_in_one_line_and_exit_code_1(orchard_home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["proxy", "--upstream", "http://127.0.0.1:8000/v1", "--port", str(port)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith(
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use; another process holds it"
    )


# -- a third-party agent -------------------------------------------------------------------------

_reached: list[str] | None = None
"""While a list: every connection or name lookup outside loopback this process attempts."""


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _reached is None:
        return
    if event == "socket.connect" and isinstance(args[1], tuple):
        host = str(args[1][0])
    elif event == "socket.getaddrinfo":
        host = str(args[0])
    else:
        return
    if host not in ("127.0.0.1", "::1", "localhost", "None"):
        _reached.append(f"{event} {host}")


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only while _reached is a list


def test_mini_swe_agent_with_litellm_is_recorded_whole_through_the_proxy_and_trains(
    client, example_task, store, monkeypatch, tmp_path
):
    """mini-swe-agent's own loop and its litellm model, on a real sandbox, talk to the upstream only
    through the proxy (tagged with the sandbox), and never outside loopback; the proxy records the
    whole episode as one trajectory with a step per model call, and SFT trains on it.

    Slow: mini-swe-agent's own loop through a real proxy, then SFT on what was recorded.
    """
    global _reached
    import yaml

    for name, value in {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm fetches its price list from GitHub
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",  # a local model has no price
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    task, image = example_task("orchard-examples__timecalc-1")
    patch = task.patch if task.patch.endswith("\n") else task.patch + "\n"
    commands = [
        "ls && git status --short",
        f"git apply <<'EOF'\n{patch}EOF",
        "git diff > patch.txt",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt",
    ]

    def script(body: dict[str, Any]) -> Reply:
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        return Reply(f"Step {turn}.", [bash_call(f"call-{turn}", commands[turn])])

    _reached = []
    try:
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.config import builtin_config_dir
        from minisweagent.models.litellm_model import LitellmModel

        from orchard.agents.minisweagent import OrchardEnvironment

        config = yaml.safe_load((builtin_config_dir / "benchmarks" / "swebench.yaml").read_text())
        with (
            upstream_serving(script) as upstream,
            Proxy(upstream.url, port=0, store=store, key=KEY) as proxy,
            client.create(image) as box,
        ):
            model = LitellmModel(
                model_name=f"openai/{MODEL}",
                model_kwargs={"api_base": proxy.tagged("mini", box.id), "api_key": KEY, "temperature": 0.0},
            )
            environment = OrchardEnvironment(sandbox=box, cwd=task.workdir, env=config["environment"]["env"])
            agent = DefaultAgent(model, environment, **{**config["agent"], "cost_limit": 0})
            result = agent.run(task.problem_statement)
            proxy.flush()
        reached = list(_reached)
    finally:
        _reached = None
    assert result["exit_status"] == "Submitted" and "timecalc" in result["submission"]
    assert reached == []
    assert len(upstream.chats()) == 4
    ((trajectory, steps),) = trajectories_of(store, "proxy-mini")
    assert trajectory.instance_id == box.id and trajectory.steps == 4 and trajectory.model == MODEL
    assert [json.loads(s.actions)[0]["arguments"]["command"] for s in steps] == commands
    assert all("<returncode>0</returncode>" in s.observation for s in steps[:3])
    sent = [m for m in agent.messages if m["role"] != "exit"]
    recorded = json.loads(trajectory.messages)
    assert [m["role"] for m in recorded] == [m["role"] for m in sent]
    assert recorded[1]["content"] == sent[1]["content"]  # mini's own task prompt, as it sent it
    assert json.loads(trajectory.tools)[0]["function"]["name"] == "bash"  # mini's BASH_TOOL
    assert {c.sandbox for c in calls_of(store, "proxy-mini")} == {box.id}
    # And it is training data: SFT of the tiny model on mini-swe-agent's recorded episode.
    from transformers import AutoTokenizer

    from orchard.train.config import SFTConfig
    from orchard.train.sft import IGNORE, sft_examples, train_sft
    from orchard.train.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    (example,) = sft_examples(tokenizer, ungraded_runs=["proxy-mini"], max_length=8192, store=store)
    assert example.trained_turns == 4
    assert "git status --short" in tokenizer.decode([t for t in example.labels if t != IGNORE])
    result = train_sft(tiny, [example], tmp_path / "sft", SFTConfig(max_steps=1, learning_rate=1e-2, max_length=8192))
    assert result["steps"] == 1 and result["losses"][0] > 0


# -- training on what was recorded ---------------------------------------------------------------


def test_sft_trains_the_tiny_model_on_a_proxy_runs_trajectories(upstream, proxy, store, tmp_path):
    """No grader saw a proxy run's trajectories: SFT skips them unless told to trust the run
    (`ungraded_runs`), and then trains on every assistant turn of each."""
    import torch
    from openai import OpenAI
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchard.train.config import SFTConfig
    from orchard.train.sft import IGNORE, sft_examples, train_sft
    from orchard.train.tiny import build_tiny_model

    chat = OpenAI(base_url=proxy.tagged("sft", "box-1"), api_key="sk-x").chat.completions
    messages: list[dict[str, Any]] = [{"role": "user", "content": "tool please"}]
    for turn in range(3):
        message = chat.create(model=MODEL, messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"OUT-{turn}"})
    proxy.flush()
    tiny = build_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    assert sft_examples(tokenizer, runs=["proxy-sft"], store=store) == []  # ungraded: skipped
    (example,) = sft_examples(tokenizer, ungraded_runs=["proxy-sft"], store=store)
    assert example.trained_turns == 3 and example.harness == "proxy"
    trained = tokenizer.decode([t for t in example.labels if t != IGNORE])
    assert "turn 0: running it" in trained and "turn 2: you said OUT-1" in trained and "OUT-0" not in trained
    before = {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(tiny).state_dict().items()}
    result = train_sft(
        tiny, [example] * 2, tmp_path / "sft", SFTConfig(max_steps=2, learning_rate=1e-2, max_length=1024)
    )
    assert result["steps"] == 2 and all(loss > 0 for loss in result["losses"])
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "sft").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


AGENT_CLI = """
import json, sys, urllib.request
base = sys.argv[1]
body = {"model": "%s", "stream": True, "messages": [{"role": "user", "content": "hello from the sandbox"}]}
request = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + sys.argv[2]})
text = ""
with urllib.request.urlopen(request, timeout=30) as answer:
    for line in answer:
        line = line.decode().strip()
        if line.startswith("data: {"):
            text += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
print(text)
"""


def test_an_agent_cli_in_a_blocked_sandbox_reaches_the_proxy_through_the_agent_and_is_recorded(
    client, base_image, upstream, store
):
    """The paper's black-box harness: an agent's own loop runs inside the sandbox, its base URL on
    the sandbox's loopback; `Sandbox.expose` carries it to the proxy on the host, the network
    staying blocked, and the conversation is recorded with the run and sandbox of the key granted for
    this attempt, whatever the path says; once revoked, the key opens nothing."""
    with Proxy(upstream.url, port=0, store=store, key=KEY, run="claw") as proxy, client.create(base_image) as box:
        assert box.exec("python3 -c \"import socket; socket.create_connection(('10.0.0.1', 80), 2)\"").exit_code != 0
        box.write_file("/tmp/agent.py", AGENT_CLI % MODEL)
        with box.expose(8009, ("127.0.0.1", proxy.port)):
            key = proxy.keys.grant("claw", box.id)
            ran = box.exec(f"python3 /tmp/agent.py http://127.0.0.1:8009/t/other/box-9/v1 {key}", timeout=60)
            proxy.keys.revoke(key)
            again = box.exec(f"python3 /tmp/agent.py http://127.0.0.1:8009/v1 {key}", timeout=60)
        assert "HTTP Error 401" in again.stderr
        assert ran.exit_code == 0, ran.stderr
        assert ran.stdout.strip() == "turn 0: you said hello from the sandbox"  # the upstream's answer, streamed
        proxy.flush()
    ((trajectory, steps),) = trajectories_of(store, "proxy-claw")
    assert trajectory.instance_id == box.id and trajectory.harness == "proxy" and len(steps) == 1
    assert json.loads(trajectory.messages)[0]["content"] == "hello from the sandbox"

"""The OpenAI adapter against real HTTP servers on loopback that misbehave as real ones do: down,
hanging, gone mid-run, answering garbage, serving another model, cutting replies at the token
limit. Each server is the standard library's `http.server` in a thread, answering as a test says."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select
from typer.testing import CliRunner

from orchard.agents import harness_factory
from orchard.agents.loop import CUT_NOTICE, Limits, run_episode
from orchard.agents.models import ModelError, ModelServerError, ModelUnavailable, OpenAIModel, model_from_spec
from orchard.cli import app
from orchard.errors import ConfigError
from orchard.store import RunRecord, SandboxRecord, TrajectoryRecord, session

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "tasks.jsonl"
HANG, CLOSE = "hang", "close"
"""Answers a test may give instead of an HTTP reply: never answer, or drop the connection."""
Answer = tuple[int, str, bytes] | str
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
HI: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]


@dataclass
class Served:
    url: str
    """The base URL, as `--base-url` takes it (`.../v1`)."""
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    """(method, path, JSON body) of every request, in order."""

    def chats(self) -> list[dict[str, Any]]:
        return [body for method, path, body in self.requests if path.endswith("/chat/completions")]


@contextmanager
def serving(answer: Callable[[str, str, Any], Answer]) -> Iterator[Served]:
    """A real HTTP server on a free loopback port; `answer(method, path, body)` says what each request gets."""
    release = threading.Event()
    served = Served("")

    class Handler(BaseHTTPRequestHandler):
        def handle_one(self, method: str) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            served.requests.append((method, self.path, body))
            reply = answer(method, self.path, body)
            if reply == HANG:
                release.wait()
            if isinstance(reply, str):
                self.close_connection = True
                return
            status, kind, payload = reply
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            self.handle_one("GET")

        def do_POST(self) -> None:
            self.handle_one("POST")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served.url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        yield served
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def as_json(data: Any, status: int = 200) -> Answer:
    return status, "application/json", json.dumps(data).encode()


def completion(content: str, finish_reason: str = "stop") -> Answer:
    message = {"role": "assistant", "content": content}
    usage = {"prompt_tokens": 11, "completion_tokens": 7}
    return as_json({"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}], "usage": usage})


def lists(*names: str) -> Answer:
    return as_json({"object": "list", "data": [{"id": name, "object": "model"} for name in names]})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once it is closed


@pytest.fixture(autouse=True)
def no_openai_settings(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


# -- the check before a run ----------------------------------------------------------------


def test_a_server_that_is_down_or_hangs_fails_the_check_in_one_line_naming_its_url():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(ConfigError) as down:
        model_from_spec("openai:m", base_url=url)
    message = str(down.value)
    assert message.startswith(f"the model server at {url} cannot be reached (GET /models: ") and "\n" not in message
    assert "Connection refused" in message and "fix --base-url" in message
    with serving(lambda method, path, body: HANG) as hanging:
        with pytest.raises(ConfigError, match=r"did not answer GET /models within 0.5 s: start it"):
            model_from_spec("openai:m", base_url=hanging.url, request_timeout=0.5)
        assert len(hanging.requests) == 1  # the check is not retried


def test_the_check_names_a_model_the_server_does_not_serve_and_what_it_does():
    with serving(lambda method, path, body: lists("qwen-0.5b", "llama3:latest")) as server:
        with pytest.raises(ConfigError, match=r"has no model 'gpt-4o': it serves qwen-0.5b, llama3:latest$"):
            model_from_spec("openai:gpt-4o", base_url=server.url)
        assert model_from_spec("openai:qwen-0.5b", base_url=server.url).name == "qwen-0.5b"
        assert model_from_spec("openai:llama3", base_url=server.url).name == "llama3"  # Ollama's default tag
        assert all(request[:2] == ("GET", "/v1/models") for request in server.requests) and len(server.requests) == 3


def test_the_check_reports_what_a_server_answered_instead_of_a_list_of_models():
    def answer(method: str, path: str, body: Any) -> Answer:
        if path == "/v1/models":
            return as_json({"error": {"message": "invalid api key"}}, status=401)
        return completion("OK")

    refused = r"refused GET /models: HTTP 401 \(application/json\) .*invalid api key"
    with serving(answer) as refusing, pytest.raises(ConfigError, match=refused):
        model_from_spec("openai:m", base_url=refusing.url)
    page = (200, "text/html", b"<!doctype html>\n<h1>llama.cpp</h1>")
    with serving(lambda method, path, body: page) as web, pytest.raises(ConfigError) as html:
        model_from_spec("openai:m", base_url=web.url)
    assert "answered GET /models with no list of models" in str(html.value)
    assert "HTTP 200 (text/html) '<!doctype html> <h1>llama.cpp</h1>'" in str(html.value)


def test_a_run_that_offers_tools_checks_the_server_takes_them():
    """A server that lists the model is still asked one token with a tool and tool_choice when the
    run offers tools: llama.cpp without --jinja refuses tools with a 500, at the check, in one line."""
    refusal = as_json({"error": {"code": 500, "message": "tools param requires --jinja flag"}}, status=500)

    def answer(method: str, path: str, body: Any) -> Answer:
        if method == "GET":
            return lists("m")
        return refusal if body.get("tools") else completion("OK")

    with serving(answer) as server:
        model_from_spec("openai:m", base_url=server.url)  # no tools in the run: the list is enough
        assert server.chats() == []
        with pytest.raises(ConfigError) as refused:
            model_from_spec("openai:m", base_url=server.url, tools=True)
        (ping,) = server.chats()
    assert str(refused.value).startswith(f"the model server at {server.url} refused POST /chat/completions: HTTP 500")
    assert "tools param requires --jinja flag" in str(refused.value) and "\n" not in str(refused.value)
    assert ping["tool_choice"] == "auto" and ping["tools"][0]["function"]["name"] == "noop" and ping["max_tokens"] == 48


def test_a_server_that_answers_a_tools_offer_with_text_is_warned_of_before_the_run(capsys):
    """llama-cpp-python without a function-calling chat format takes the tools and answers text:
    the check asks for one call of its tool, and a reply without one is a warning (a small model
    may miss once; the run goes on), said before any sandbox starts."""
    call = {"type": "function", "function": {"name": "noop", "arguments": "{}"}, "id": "c1"}
    calls = as_json({"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]})

    def answer(ignores_tools: bool):
        return lambda method, path, body: (
            lists("m") if method == "GET" else (completion("OK") if ignores_tools else calls)
        )

    for ignores_tools in (False, True):
        with serving(answer(ignores_tools)) as server:
            model_from_spec("openai:m", base_url=server.url, tools=True)
        warned = capsys.readouterr().err
        if ignores_tools:
            assert warned == (
                f"warning: the model server at {server.url} answered the check with text, not a call of the tool it was "
                "offered: if it ignores tools (llama-cpp-python without a function-calling chat format, a chat template "
                "without tools), every step of the tools and cli harnesses ends with 'no tool call'\n"
            )
        else:
            assert warned == ""


def test_a_model_made_unchecked_sends_nothing_and_an_option_an_adapter_lacks_is_named(tmp_path, monkeypatch):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    assert model_from_spec("openai:m", base_url=url, check=False).name == "m"  # a judge made for later
    (tmp_path / "my_adapter.py").write_text(
        "class Mine:\n"
        "    name = 'mine'\n"
        "    @classmethod\n"
        "    def from_spec(cls, argument, *, base_url=None, api_key=None, temperature=0.0):\n"
        "        return cls()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert model_from_spec("my_adapter:Mine", temperature=0.5).name == "mine"
    with pytest.raises(ConfigError, match=r"^model my_adapter:Mine does not take --max-tokens, --request-timeout$"):
        model_from_spec("my_adapter:Mine", max_tokens=9, request_timeout=3)


def test_only_function_calls_are_replies_and_calls_without_ids_get_unique_ones():
    calls = [
        {"type": "function", "function": {"name": "bash", "arguments": "{}"}},
        {"type": "custom", "custom": {"name": "grammar", "input": "x"}},
        {"function": {"name": "bash", "arguments": {"command": "ls"}}},
    ]
    answer = as_json({"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": calls}}]})
    with serving(lambda method, path, body: answer) as server:
        model = OpenAIModel("m", base_url=server.url)
        first, second = model.complete(HI, TOOLS), model.complete(HI, TOOLS)
    ids = [call.id for reply in (first, second) for call in reply.tool_calls]
    assert [call.name for call in first.tool_calls] == ["bash", "bash"] and len(set(ids)) == 4


def test_a_server_without_a_list_of_models_is_asked_for_one_token():
    def answer(method: str, path: str, body: Any) -> Answer:
        if path.endswith("/models"):
            return 404, "text/plain", b"Not Found"
        return completion("OK") if path == "/v1/chat/completions" else (404, "text/plain", b"Not Found")

    with serving(answer) as server:
        model_from_spec("openai:m", base_url=server.url)
        (ping,) = server.chats()
        assert ping["model"] == "m" and ping["max_tokens"] == 1
        wrong = server.url.removesuffix("/v1")  # a base URL without its /v1: nothing is there
        with pytest.raises(ConfigError, match=r"refused POST /chat/completions: HTTP 404 \(text/plain\) 'Not Found'"):
            model_from_spec("openai:m", base_url=wrong)


def test_openai_without_a_server_or_a_key_is_a_config_error(monkeypatch):
    with pytest.raises(ConfigError, match=r"openai:gpt-4o needs a server: --base-url URL \(or OPENAI_BASE_URL\)"):
        model_from_spec("openai:gpt-4o")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert OpenAIModel("gpt-4o").url == "https://api.openai.com/v1"  # the hosted API, with a key (no request made)


# -- requests and answers ------------------------------------------------------------------


def test_requests_carry_tool_choice_with_the_tools_and_the_options():
    def answer(method: str, path: str, body: Any) -> Answer:
        return lists("m") if method == "GET" else completion("done", "tool_calls" if body.get("tools") else "stop")

    with serving(answer) as server:
        model = model_from_spec("openai:m", base_url=server.url, max_tokens=77, temperature=0.5, request_timeout=9)
        assert isinstance(model, OpenAIModel)
        with_tools = model.complete(HI, TOOLS)
        plain = model.complete(HI, None)
        first, second = server.chats()
    assert first["tool_choice"] == "auto" and first["tools"] == TOOLS
    assert "tool_choice" not in second and "tools" not in second
    assert all(body["max_tokens"] == 77 and body["temperature"] == 0.5 for body in (first, second))
    assert (with_tools.finish_reason, plain.finish_reason) == ("tool_calls", "stop")
    assert (plain.content, plain.prompt_tokens, plain.completion_tokens) == ("done", 11, 7)


@pytest.mark.parametrize(
    "body",
    [
        (200, "text/html", b"<!doctype html><title>Bad gateway</title>"),
        as_json({"object": "error", "message": "model is loading"}),
        (200, "application/json", b'{"choices": [{"message": {"content": "cut sh'),
        as_json({"choices": []}),
        as_json({"choices": [{"message": "not an object"}]}),
    ],
)
def test_an_answer_that_holds_no_reply_is_the_servers_failure(body):
    """What the server sent instead of a chat completion says nothing of the model: the machine's
    fault, counted with the calls it failed in a row."""
    with serving(lambda method, path, request: body) as server:
        model = OpenAIModel("m", base_url=server.url)
        for _ in range(model.max_failures - 1):
            with pytest.raises(ModelServerError, match=r"^the model server answered no chat completion .*HTTP 200"):
                model.complete(HI, None)
        with pytest.raises(ModelUnavailable, match=r"in a row, so the run stops \(last: an answer that is no chat"):
            model.complete(HI, None)


@pytest.mark.parametrize(
    ("status", "servers"),
    [(400, False), (413, False), (422, False), (401, True), (403, True), (404, True), (429, True), (500, True)],
)
def test_only_a_request_too_big_or_malformed_is_the_models_and_every_other_status_the_servers(status, servers):
    """A context overflow is a 400 (413, 422 for some servers): the model's. A llama.cpp started
    without --jinja answers 500 to every request with tools, a revoked key 401, a rate limit 429
    after the retries: the server's, and enough of them in a row stop the run."""
    answer = as_json({"error": {"message": f"status {status}"}}, status=status)
    with serving(lambda method, path, body: answer) as server:
        model = OpenAIModel("m", base_url=server.url)
        for _ in range(model.max_failures):
            with pytest.raises(ModelError, match=f"Error code: {status} - status {status}") as error:
                model.complete(HI, None)
            assert isinstance(error.value, ModelServerError) is servers
        assert isinstance(error.value, ModelUnavailable) is servers  # the third in a row


def test_a_hanging_server_times_out():
    with serving(lambda method, path, body: HANG) as server:
        model = OpenAIModel("m", base_url=server.url, request_timeout=0.3)
        with pytest.raises(ModelServerError, match="the model server failed: APITimeoutError") as error:
            model.complete(HI, None)
        assert isinstance(error.value, ConnectionError)  # the machine's fault, not the model's
        assert len(server.chats()) == 3  # the request and its two retries, each timed out
        with pytest.raises(ModelServerError):
            model.complete(HI, None)
        with pytest.raises(ModelUnavailable) as stopped:  # the third in a row
            model.complete(HI, None)
    assert str(stopped.value).endswith(
        "; if the server is only slow, raise --request-timeout (now 0.3 s); the same command resumes the run"
    )


def test_a_server_gone_for_three_calls_in_a_row_stops_every_later_call():
    gone = threading.Event()

    def answer(method: str, path: str, body: Any) -> Answer:
        return CLOSE if gone.is_set() else completion("fine")

    with serving(answer) as server:
        model = OpenAIModel("m", base_url=server.url)
        gone.set()
        for _ in range(2):
            with pytest.raises(ModelServerError) as error:
                model.complete(HI, None)
            assert not isinstance(error.value, ModelUnavailable)
        gone.clear()
        assert model.complete(HI, None).content == "fine"  # an answer starts the count again
        gone.set()
        for _ in range(2):
            with pytest.raises(ModelServerError) as error:
                model.complete(HI, None)
            assert not isinstance(error.value, ModelUnavailable)
        with pytest.raises(ModelUnavailable) as stopped:
            model.complete(HI, None)
        assert str(stopped.value).startswith(f"the model server at {server.url} did not answer 3 requests in a row")
        asked = len(server.requests)
        gone.clear()
        with pytest.raises(ModelUnavailable):  # the run stops: no episode asks again
            model.complete(HI, None)
        assert len(server.requests) == asked


# -- through the loop and the CLI ----------------------------------------------------------


@pytest.fixture(scope="module")
def example(example_task):
    return example_task("orchard-examples__textkit-2")


def test_a_cut_reply_is_told_and_a_broken_answer_ends_the_episode_keeping_its_steps(example, client):
    replies = iter(
        [
            completion("Let me look around first.\n\n```bash\nls -la && cat READ", finish_reason="length"),
            completion("Shorter now.\n\n```bash\necho hi-from-the-box\n```"),
            (200, "text/html", b"<html>502 Bad Gateway</html>"),
        ]
    )
    task, image = example
    harness = harness_factory("bash")()
    with serving(lambda method, path, body: next(replies)) as server, client.create(image) as box:
        model = OpenAIModel("m", base_url=server.url)
        episode = run_episode(task, harness, model.session(task, harness), box, model_name="m", limits=Limits())
        chats = server.chats()
    assert episode.status == "aborted" and "no chat completion" in (episode.error or "")
    assert "text/html" in (episode.error or "")
    assert [s.finish_reason for s in episode.steps] == ["length", "stop"]
    assert episode.steps[0].format_error and episode.steps[1].observation.strip() == "hi-from-the-box"
    told = chats[1]["messages"][-1]
    assert (
        told["role"] == "user" and told["content"].startswith("Format error:") and told["content"].endswith(CUT_NOTICE)
    )
    assert all(CUT_NOTICE not in str(m["content"]) for m in chats[2]["messages"][-2:])  # told once, for that reply
    assert [m["role"] for m in episode.messages] == ["system", "user", "assistant", "user", "assistant", "user"]


runner = CliRunner()


def test_eval_against_a_server_that_is_down_is_one_line_and_starts_nothing(orchard_home):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    for command in ("eval", "collect"):
        result = runner.invoke(app, [command, "--tasks", str(TASKS), "--model", "openai:x", "--base-url", url])
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith(f"error: the model server at {url} cannot be reached")
        assert result.stderr.count("\n") == 1
    with serving(lambda method, path, body: lists("served")) as server:
        wrong = runner.invoke(app, ["eval", "--tasks", str(TASKS), "--model", "openai:x", "--base-url", server.url])
    assert (
        wrong.exit_code == 1
        and wrong.stderr == f"error: the model server at {server.url} has no model 'x': it serves served\n"
    )
    bad = runner.invoke(app, ["eval", "--tasks", str(TASKS), "--model", "noop", "--request-timeout", "0"])
    assert bad.exit_code == 1 and bad.stderr.startswith("error: --request-timeout") and bad.stderr.count("\n") == 1
    with session() as db:
        assert db.exec(select(RunRecord)).all() == [] and db.exec(select(SandboxRecord)).all() == []


def test_a_server_that_stops_answering_mid_run_stops_the_run_in_one_line(orchard_home, example_repos, base_image):
    """Slow: a real eval whose model server stops answering: the request timeouts are waited out before the run stops."""

    def answer(method: str, path: str, body: Any) -> Answer:
        return lists("m") if method == "GET" else HANG

    ids = ",".join(f"orchard-examples__textkit-{n}" for n in range(1, 6))
    options = ["--max-tokens", "33", "--temperature", "0.7", "--request-timeout", "0.5"]
    with serving(answer) as server:
        flags = ["--ids", ids, "--repos", str(example_repos), "--base-url", server.url, "--concurrency", "1"]
        result = runner.invoke(app, ["eval", "--tasks", str(TASKS), "--model", "openai:m", *flags, *options])
        chats = server.chats()
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # after the progress bar
    assert len(errors) == 1 and result.stderr.endswith(errors[0] + "\n")
    assert errors[0].startswith(f"error: the model server at {server.url} did not answer 3 requests in a row")
    assert "APITimeoutError" in errors[0]
    assert len(chats) == 9 and all(body["max_tokens"] == 33 and body["temperature"] == 0.7 for body in chats)
    with session() as db:
        (run,) = db.exec(select(RunRecord)).all()
        trajectories = db.exec(select(TrajectoryRecord)).all()
    assert run.status == "failed" and "did not answer 3 requests in a row" in (run.error or "")
    assert len(trajectories) == 3 and all(t.status == "aborted" for t in trajectories)  # kept; the rest not begun

"""Harnesses whose agent loop is a program of its own: a coding CLI (Codex, Claude Code, opencode,
pi, Hermes, mini-swe-agent) run unmodified in the sandbox, with the attempt's model behind it.

The loop is turned around: the CLI asks the model, Orchard answers. For one attempt:

    CLI in the sandbox ── 127.0.0.1:MODEL_PORT ──expose──▶ orchard proxy (this host) ──▶ ModelEndpoint
    (its own API: Chat Completions,                         a key for this attempt only;   the attempt's
     Responses or Anthropic Messages)                       translated to Chat Completions  ModelSession

* `ModelEndpoint` serves any Orchard model (`scripted:`, `hf:`, `openai:`, ...) as an OpenAI Chat
  Completions server on this host's loopback: each request is the attempt's `ModelSession.complete`
  on the request's messages and tools, so every model spec works behind every CLI.
* The proxy (`orchard.proxy`), one for the process, speaks each CLI's API, bounds every byte, and
  answers only the key granted to the attempt, whose calls it sends to the attempt's endpoint.
* `Sandbox.expose` carries the CLI's connections to it: the sandbox's network stays blocked.
* The CLIs come from the tools bundle (`orchard.env.tools`), mounted read-only into any image.

The episode is what the endpoint saw: one step per model call of the main conversation (calls
offering the CLI's tools; side calls, a title or a summary, are answered and their tokens count,
but they are no steps), its messages the conversation the CLI sent last plus the reply, so the
trajectory trains and shows like any harness's. It is the CLI's own account of the conversation
(the assistant turns included), as hostile as anything else from the sandbox: a CLI's commands
can rewrite what it sends. Limits, on every call: past the attempt's steps, tokens or time the
endpoint answers the main conversation a plain text telling the CLI to stop (which ends its
turn), then refuses everything (a 400, which CLIs do not retry); the CLI's command is killed 30 s
past the time limit. Requests of one attempt are read one at a time (the others wait unread).
A model request that fails ends the episode `aborted` and the CLI is refused from then on; so
does a CLI that exits non-zero without being told to stop (it broke: not the model's ending),
or never calls its model; one that exits after a reply with tool calls stopped at a limit of
its own (`truncated`). When the CLI has exited, its key is revoked and whatever still asks is
refused. The submission is taken from the sandbox as for every harness (SWE: the working
tree's diff).
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, ClassVar

from orchard.agents.base import Action, FormatError, Message, Reply, Step, clip
from orchard.agents.loop import Episode, Limits, StepLog
from orchard.errors import OrchardError

if TYPE_CHECKING:
    from orchard.agents.models import ModelSession
    from orchard.env.client import Sandbox
    from orchard.proxy.server import Proxy
    from orchard.tasks.base import TaskBase

log = logging.getLogger("orchard.agents.external")

MODEL_PORT = 18009
"""The port inside the sandbox where the CLI finds its model (the proxy, exposed)."""
HOME = "/tmp/orchard-cli"
"""The CLI's home in the sandbox: its configuration, sessions and caches (a writable place in any image)."""
MAX_REQUEST = 16 << 20
"""The largest request the attempts' proxy forwards (a long CLI conversation is a few MB)."""
MAX_BODY = MAX_REQUEST + (1 << 20)
"""The largest request the endpoint reads (what the proxy forwards, translated)."""
STOP_TEXT = "[Orchard: this episode has reached its {what}. Stop now: do not call any more tools.]"
GRACE_SECONDS = 30.0
"""How long the CLI's command may run past the episode's time limit before it is killed."""
IDLE_SECONDS = 3600.0
"""The longest one model answer may take (a slow model; a step measured by replay), for the proxy
and the exposed connection alike."""


# -- the model, served as Chat Completions --------------------------------------------------


class ModelEndpoint:
    """An OpenAI Chat Completions server on 127.0.0.1 (one per process, `shared()`), where each
    attempt opens a route of its own: `open(answer)` gives a ROUTE whose `POST /ROUTE/v1/chat/
    completions` answers with `answer(body)`, a chat completion or `(status, error message)`
    (`url(route)` is its base URL). A streamed request (`"stream": true`) gets the same
    completion as one chunk, then one with the finish reason and usage, then `[DONE]`."""

    _shared: ClassVar[ModelEndpoint | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.routes: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any] | tuple[int, str]], threading.Lock]] = {}
        """Each open route's answer, and the lock its requests take before their body is read (one
        at a time: a sandbox's many connections wait unread, not parsed, so memory stays bounded)."""
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                endpoint._post(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="orchard-model-endpoint", daemon=True).start()

    @classmethod
    def shared(cls) -> ModelEndpoint:
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    @contextmanager
    def open(self, answer: Callable[[dict[str, Any]], dict[str, Any] | tuple[int, str]]) -> Iterator[str]:
        route = secrets.token_hex(16)
        self.routes[route] = (answer, threading.Lock())
        try:
            yield route
        finally:
            self.routes.pop(route, None)

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.port}/{route}/v1"

    def _post(self, request: BaseHTTPRequestHandler) -> None:
        route, _, path = request.path.split("?")[0].strip("/").partition("/")
        found = self.routes.get(route)
        if found is None or path != "v1/chat/completions":
            return _send_json(request, 404, _error("no such route"))
        answer, lock = found
        length = int(request.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            return _send_json(request, 413, _error(f"the body must be 1 to {MAX_BODY} bytes"))
        with lock:
            try:
                body = json.loads(request.rfile.read(length))
                if not isinstance(body, dict) or not _chat_request(body):
                    raise ValueError("messages must be a list of objects, tools a list of function tools")
            except (ValueError, RecursionError) as exc:
                return _send_json(request, 400, _error(f"not a chat completions request: {exc}"))
            result = answer(body)
        if isinstance(result, tuple):
            return _send_json(request, result[0], _error(result[1]))
        if not body.get("stream"):
            return _send_json(request, 200, result)
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.send_header("Cache-Control", "no-cache")
        request.send_header("Connection", "close")
        request.end_headers()
        request.close_connection = True
        for chunk in _chunks(result):
            request.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        request.wfile.write(b"data: [DONE]\n\n")
        request.wfile.flush()


def _chat_request(body: dict[str, Any]) -> bool:
    """The shape the endpoint relies on: messages are objects, tools (if any) function tools."""
    messages, tools = body.get("messages"), body.get("tools") or []
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages) or not isinstance(tools, list):
        return False
    return all(isinstance(t, dict) and isinstance(t.get("function", t), dict) for t in tools)


def _send_json(request: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    request.send_response(status)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


def completion(reply: Reply, model: str) -> dict[str, Any]:
    """A reply as an OpenAI chat completion."""
    message = reply.message()
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def _chunks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    choice = answer["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    head = {key: answer[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    return [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {
            **head,
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            "usage": answer["usage"],
        },
    ]


# -- the proxy the sandboxes reach --------------------------------------------------------

_proxy: Proxy | None = None
_proxy_lock = threading.Lock()


def attempt_proxy() -> Proxy:
    """The process's proxy for attempts (started on first use, on a free port of 127.0.0.1; it
    records nothing itself: each attempt's episode is its record)."""
    global _proxy
    with _proxy_lock:
        if _proxy is None:
            from orchard.proxy.server import Proxy

            upstream = f"http://127.0.0.1:{ModelEndpoint.shared().port}"
            proxy = Proxy(upstream, port=0, record=False, timeout=IDLE_SECONDS, max_request=MAX_REQUEST)
            proxy.start()
            _proxy = proxy
        return _proxy


# -- the episode ----------------------------------------------------------------------------


@dataclass
class CliRun:
    """What a CLI harness gets to write its command: where its model is and what to call it."""

    base_url: str
    """The proxy's base URL in the sandbox, ending in `/v1` (an Anthropic client takes it without)."""
    key: str
    """The attempt's key."""
    model: str
    """The model's name as the CLI should send it."""
    prompt_file: str
    """A file in the sandbox holding the task's prompt."""
    workdir: str
    limits: Limits
    bin: str = ""
    """The tools bundle's commands folder in the sandbox: CLIs are started by path, and the folder
    comes last on PATH (`rg` for a CLI's search tool, where the image has none), so the commands
    the agent runs find the image's own `python3` and `node` first."""


class ExternalHarness:
    """What every harness that runs a program of its own shares; a subclass says how to start its
    CLI (`command`, `environment`, `files`) and how a scripted model plays its tools (`encode`)."""

    name: ClassVar[str]
    tools_bundle: ClassVar[bool] = True
    """The sandbox needs the tools bundle mounted (`orchard.env.tools`)."""
    model_name: ClassVar[str] = "orchard"

    def __init__(self) -> None:
        self.offered: list[dict[str, Any]] = []
        """The tools of the request being answered (a scripted model plays the CLI's own)."""

    # -- what a subclass says --

    def command(self, run: CliRun) -> str:
        """The shell command that runs the CLI on `run.prompt_file` to the end."""
        raise NotImplementedError

    def environment(self, run: CliRun) -> dict[str, str]:
        return {}

    def files(self, run: CliRun) -> dict[str, str]:
        """Configuration files to write before the start, by path in the sandbox."""
        return {}

    def is_main(self, body: dict[str, Any]) -> bool:
        """Whether a request is a turn of the agent's conversation (it offers the CLI's tools), not
        a side call (a title, a summary); side calls are answered and counted, not steps."""
        return bool(body.get("tools"))

    def encode(self, step: Step, index: int) -> Reply:
        """The reply playing `step` with the CLI's own tools (`self.offered`)."""
        raise NotImplementedError

    def ended(self, reply: Message) -> bool:
        """Whether the model's last reply ends the CLI's work (a plain answer, for most CLIs): a
        CLI that exits after any other stopped at a limit of its own (`truncated`)."""
        return not reply.get("tool_calls")

    # -- the Harness methods the loop would call: a CLI runs its own loop --

    def system_prompt(self, task: dict[str, Any]) -> str:
        return ""

    def task_prompt(self, task: dict[str, Any]) -> str:
        return str(task.get("prompt") or task.get("problem_statement") or "")

    def tools(self) -> list[dict[str, Any]] | None:
        return None

    def parse(self, reply: Reply) -> list[Action]:
        raise FormatError("a CLI harness parses its model's replies itself")

    def execute(self, action: Action, box: Sandbox, workdir: str) -> str:
        raise OrchardError("a CLI harness runs its own actions")

    def observation_messages(self, action: Action, observation: Any) -> list[Message]:
        return []

    def format_error_messages(self, reply: Reply, error: FormatError) -> list[Message]:
        return []

    # -- the episode --

    def drive(
        self,
        task: TaskBase,
        session: ModelSession,
        box: Sandbox,
        *,
        model_name: str,
        limits: Limits,
        on_step: Callable[[int, Sandbox, Episode], object] | None = None,
    ) -> Episode:
        """Run the CLI on `task` in `box` with `session` answering its model calls."""
        prompt = self.task_prompt({**task.public(), "prompt": task.prompt()})
        episode = Episode(uuid.uuid4().hex, task, self.name, model_name, [], None, status="completed")
        episode.dialogue.append({"role": "user", "content": task.prompt()})
        turn = _Turns(self, episode, session, box, limits, on_step)
        started = time.monotonic()
        try:
            task.start(box)
            proxy = attempt_proxy()
            with ModelEndpoint.shared().open(turn.answer) as route:
                key = proxy.keys.grant("cli", box.id, route=route)
                try:
                    idle = min(limits.max_seconds, IDLE_SECONDS)  # a model's answer may take that long
                    with box.expose(MODEL_PORT, (proxy.host, proxy.port), idle_timeout=idle):
                        self._run_cli(box, task, prompt, key, limits, turn)
                finally:
                    proxy.keys.revoke(key)
                    turn.closed = True  # a request still waiting is refused from now on
            turn.close()  # and the last step is measured
        except OrchardError as exc:  # the sandbox failed
            episode.status, episode.error = "aborted", str(exc)
        if turn.failure is not None:
            episode.status, episode.error = "aborted", turn.failure
        elif turn.stopped is not None and episode.status == "completed":
            episode.status = turn.stopped
        elif episode.status == "completed" and not episode.steps:
            episode.status, episode.error = "aborted", f"{self.name} never called its model: {turn.cli_output}"
        elif episode.status == "completed" and not self.ended(episode.messages[-1]):
            episode.status = "truncated"  # the CLI stopped at a limit of its own, its work unfinished
        episode.submission = task.conclude(box, episode.messages, episode.dialogue)
        episode.duration = time.monotonic() - started
        return episode

    def _run_cli(self, box: Sandbox, task: TaskBase, prompt: str, key: str, limits: Limits, turn: _Turns) -> None:
        from orchard.env.tools import TOOLS_MOUNT

        base = f"http://127.0.0.1:{MODEL_PORT}/v1"
        run = CliRun(base, key, self.model_name, f"{HOME}/prompt.md", task.workdir, limits, f"{TOOLS_MOUNT}/bin")
        box.write_file(run.prompt_file, prompt)
        for path, content in self.files(run).items():
            box.write_file(path, content)
        env = {"HOME": f"{HOME}/home", "TERM": "dumb", "NO_COLOR": "1", "CI": "1", **self.environment(run)}
        home = shlex.quote(env["HOME"])
        command = f'mkdir -p {home} && export PATH="${{PATH:-/usr/bin:/bin}}:{run.bin}" && {self.command(run)}'
        limit = limits.max_seconds + GRACE_SECONDS if math.isfinite(limits.max_seconds) else None
        result = box.exec(command, cwd=task.workdir, env=env, timeout=limit)
        output = clip(result.stdout + result.stderr, 4000)
        if result.timed_out and turn.stopped is None:
            turn.stopped = "time_limit"
        elif result.exit_code != 0 and not turn.told_to_stop and turn.failure is None:
            # before any model call: it could not start (a bad setup); after: it broke (a CLI's fault
            # or the sandbox's, not the model's: a model's own endings are replies). A CLI told to
            # stop may exit non-zero on it (refused, or at its own limit): the stop is the ending.
            when = "after" if turn.steps_taken else "before"
            code = result.exit_code if result.exit_code is not None else f"no exit code ({result.error})"
            turn.failure = f"{self.name} exited with {code} {when} calling its model: {output}"
        log.debug("%s exited %s: %s", self.name, result.exit_code, output)
        turn.cli_output = output


class _Turns:
    """The endpoint's side of one episode: each request of the CLI answered by the model session,
    kept as a step, within the limits."""

    def __init__(
        self,
        harness: ExternalHarness,
        episode: Episode,
        session: ModelSession,
        box: Sandbox,
        limits: Limits,
        on_step: Callable[[int, Sandbox, Episode], object] | None,
    ):
        self.harness, self.episode, self.session, self.box = harness, episode, session, box
        self.limits, self.on_step = limits, on_step
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.failure: str | None = None
        self.stopped: str | None = None
        """Why the episode was told to stop (`truncated`, `time_limit`), if it was."""
        self.told_to_stop = False
        self.closed = False
        """The episode is over: every request is refused."""
        self.side_tokens = 0
        """Tokens of the calls that are no steps (they count towards the limit too)."""
        self.measured = 0
        """Steps `on_step` has seen."""
        self.cli_output = ""

    @property
    def steps_taken(self) -> int:
        return len(self.episode.steps)

    def answer(self, body: dict[str, Any]) -> dict[str, Any] | tuple[int, str]:
        with self.lock:  # one call at a time: a CLI's parallel side calls wait their turn
            try:
                return self._answer(body)
            except OrchardError as exc:  # a step measured by replay: the sandbox failed
                self.failure = str(exc)
            except Exception as exc:  # a model that broke (out of memory, a chat template), or its script
                log.exception("%s: the model failed", self.harness.name)
                self.failure = f"the model request failed: {type(exc).__name__}: {exc}"
            return 400, self.failure

    def close(self) -> None:
        """The CLI has exited: refuse whatever still asks, measure the last step."""
        with self.lock:
            self.closed = True
            self.measure()

    def _answer(self, body: dict[str, Any]) -> dict[str, Any] | tuple[int, str]:
        episode = self.episode
        if self.closed or self.failure is not None:
            return 400, f"the episode has ended{': ' + self.failure if self.failure else ''}"
        main = self.harness.is_main(body)
        messages, tools = body["messages"], body.get("tools") or None
        if main:
            self.measure()  # the previous step's actions have run: the CLI asks again
            if episode.steps and any(m.get("role") == "assistant" for m in messages):
                episode.steps[-1].observation = _last_observation(messages)  # what they showed, as the CLI tells
        reason = self._limit()
        if reason is not None:  # every call: a side call spends the model too
            if self.told_to_stop or not main:
                return 400, f"the episode has ended: its {reason}"
            self.told_to_stop = True
            return completion(Reply(content=STOP_TEXT.format(what=reason)), self.harness.model_name)
        started = time.monotonic()
        self.harness.offered = tools or []
        if not main and getattr(self.session, "replays", False):  # a script plays the agent's turns only
            reply = Reply(content="OK", prompt_tokens=1, completion_tokens=1)
        else:
            try:
                reply = self.session.complete(messages, tools)
            except (OrchardError, ValueError) as exc:  # ValueError: a script cannot play the tools offered
                self.failure = f"the model request failed: {exc}"
                return 400, self.failure
        if not main:
            self.side_tokens += reply.prompt_tokens + reply.completion_tokens
        else:  # the conversation as the CLI last sent it (after a compaction too), and the reply
            episode.messages, episode.tools = [*messages, reply.message()], tools
            step = StepLog(
                len(episode.steps),
                reply.content,
                [{"name": c.name, "arguments": _arguments(c.arguments)} for c in reply.tool_calls],
                "",  # its actions' results come with the CLI's next request
                None,
                reply.prompt_tokens,
                reply.completion_tokens,
                time.monotonic() - started,
                reply.finish_reason,
            )
            episode.steps.append(step)
            if not reply.tool_calls:
                episode.dialogue.append({"role": "assistant", "content": reply.content})
        return completion(reply, str(body.get("model") or self.harness.model_name))

    def measure(self) -> None:
        """`on_step` for each step whose actions have run since it was last called: a step's
        actions run after its reply reaches the CLI, so it is measured at the CLI's next request,
        or when the CLI has exited."""
        while self.on_step is not None and self.measured < len(self.episode.steps):
            self.on_step(self.measured, self.box, self.episode)
            self.measured += 1

    def _limit(self) -> str | None:
        episode, limits = self.episode, self.limits
        if len(episode.steps) >= limits.episode_steps:
            self.stopped = "truncated"
            return "step limit"
        if episode.prompt_tokens + episode.completion_tokens + self.side_tokens > limits.max_tokens:
            self.stopped = "truncated"
            return "token limit"
        if time.monotonic() - self.started > limits.max_seconds:
            self.stopped = "time_limit"
            return "time limit"
        return None


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _last_observation(messages: list[Message]) -> str:
    """What the CLI showed the model since its last reply (the tool results), as text."""
    shown = []
    for message in reversed(messages):
        if message.get("role") == "assistant":
            break
        if message.get("role") == "system":  # the CLI's reminders, not what an action showed
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        shown.append(str(content or ""))
    return clip("\n".join(reversed(shown)), 4000)

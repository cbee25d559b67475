"""What the proxy records: each call as it came and went, and each conversation as a trajectory.

The server hands over a `Call` (bytes as they crossed the wire) and goes on; a process of its own
(`Recorder`, then `Writer`) parses and writes it, one transaction per call: the call's row and,
for a chat call that got an answer, its step in a trajectory and the trajectory itself brought up
to date. A killed proxy so leaves whole records only, and the calls still queued are lost.

A trajectory is one conversation within one tag (run, sandbox). A chat request continues the
trajectory whose messages (the last request's messages and its answer) its own messages start
with, the longest such one when several do; a request that continues none starts a new one.
Messages are compared as what a model sees, by `canonical`: role, text, tool calls' names and
arguments (not ids, which clients make up; not fields that clients add or drop), so a client that
sends an answer back in its own shape (litellm, the OpenAI client) still continues its trajectory.
Failed calls are recorded as calls, never as steps: the client's retry continues the conversation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlmodel import col, func, select

from orchard.store import Store, TrajectoryRecord, session
from orchard.store.runs import finish_run, start_run
from orchard.store.tables import ProxyCallRecord

CHAT = "/v1/chat/completions"
HARNESS = "proxy"
"""The harness of every trajectory the proxy records (it does not know the real one)."""
UNTAGGED = "proxy"
"""The instance id of a trajectory whose calls named no sandbox."""


def run_id_of(name: str) -> str:
    """The id of the run (kind `proxy`) that calls tagged `name` are recorded under."""
    return f"proxy-{name}"


@dataclass
class Call:
    """One request through the proxy and what came back, as bytes: parsed later, by the recorder."""

    run: str
    """The run's name (its tag, or the proxy's `--run`)."""
    sandbox: str | None
    path: str
    request: bytes
    started_at: float
    duration: float
    http_status: int | None
    """The upstream's status; None when it never answered."""
    answer: bytes
    """The answer's body as received: JSON, or for a stream its server-sent events."""
    stream: bool
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.http_status is not None and self.http_status < 400


# -- streams -------------------------------------------------------------------------------------


def sse_events(text: str) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a stream of server-sent events, up to `data: [DONE]` (others skipped)."""
    for event in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in event.split("\n") if line.startswith("data:"))
        if data == "[DONE]":
            return
        try:
            payload = json.loads(data) if data else None
        except ValueError:
            continue
        if isinstance(payload, dict):
            yield payload


class StreamAssembler:
    """The chunks of a streamed answer merged into the answer the same call would give unstreamed:
    text and reasoning concatenated, tool-call deltas merged by index, the finish reason, usage,
    log-probs (chat: `content` lists; completions: every list) and vLLM's token ids."""

    def __init__(self) -> None:
        self.top: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}

    def feed(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model", "system_fingerprint", "prompt_token_ids"):
            if chunk.get(key) is not None:
                self.top.setdefault(key, chunk[key])
        if chunk.get("usage"):
            self.top["usage"] = chunk["usage"]
        self.top.setdefault("object", str(chunk.get("object") or "").removesuffix(".chunk"))
        for choice in chunk.get("choices") or []:
            self._feed_choice(choice)

    def _feed_choice(self, choice: dict[str, Any]) -> None:
        state = self.choices.setdefault(int(choice.get("index") or 0), {"text": [], "reasoning": [], "calls": {}})
        delta = choice.get("delta") or {}
        if delta.get("role"):
            state["role"] = delta["role"]
        for key, into in (("content", "text"), ("reasoning_content", "reasoning"), ("reasoning", "reasoning")):
            if isinstance(delta.get(key), str):
                state[into].append(delta[key])
        if isinstance(choice.get("text"), str):  # a completion's chunk
            state["text"].append(choice["text"])
        for position, call in enumerate(delta.get("tool_calls") or []):
            merged = state["calls"].setdefault(
                call.get("index", position), {"id": None, "type": "function", "name": [], "arguments": []}
            )
            merged["id"] = merged["id"] or call.get("id")
            merged["type"] = call.get("type") or merged["type"]
            function = call.get("function") or {}
            merged["name"].append(function.get("name") or "")
            merged["arguments"].append(function.get("arguments") or "")
        if choice.get("finish_reason") is not None:
            state["finish_reason"] = choice["finish_reason"]
        for key in ("token_ids", "prompt_token_ids"):
            if choice.get(key):
                state.setdefault(key, []).extend(choice[key])
        _merge_logprobs(state, choice.get("logprobs"))

    def answer(self) -> dict[str, Any]:
        """The assembled answer: a `chat.completion` (or `text_completion`) object."""
        chat = self.top.get("object", "chat.completion") != "text_completion"
        choices = []
        for index, state in sorted(self.choices.items()):
            choice: dict[str, Any] = {"index": index, "finish_reason": state.get("finish_reason")}
            if chat:
                message: dict[str, Any] = {"role": state.get("role", "assistant"), "content": "".join(state["text"])}
                if state["reasoning"]:
                    message["reasoning_content"] = "".join(state["reasoning"])
                if state["calls"]:
                    message["tool_calls"] = [
                        {
                            "id": call["id"],
                            "type": call["type"],
                            "function": {"name": "".join(call["name"]), "arguments": "".join(call["arguments"])},
                        }
                        for _, call in sorted(state["calls"].items())
                    ]
                choice["message"] = message
            else:
                choice["text"] = "".join(state["text"])
            for key in ("logprobs", "token_ids", "prompt_token_ids"):
                if key in state:
                    choice[key] = state[key]
            choices.append(choice)
        return {**self.top, "object": "chat.completion" if chat else "text_completion", "choices": choices}


def _merge_logprobs(state: dict[str, Any], logprobs: Any) -> None:
    """Append one chunk's log-probs to a choice's: every list in them grows, other values are kept."""
    if not isinstance(logprobs, dict):
        return
    merged = state.setdefault("logprobs", {})
    for key, value in logprobs.items():
        if isinstance(value, list):
            merged.setdefault(key, []).extend(value)
        elif value is not None:
            merged.setdefault(key, value)


def assembled(body: bytes) -> dict[str, Any]:
    """A streamed answer's server-sent events as one answer."""
    assembler = StreamAssembler()
    for chunk in sse_events(body.decode("utf-8", "replace")):
        assembler.feed(chunk)
    return assembler.answer()


# -- what a call holds ---------------------------------------------------------------------------


def first_choice(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer's first choice, or {} when it has none."""
    choices = answer.get("choices")
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}


def token_ids(answer: dict[str, Any]) -> dict[str, Any] | None:
    """The prompt's and the first choice's token ids, when the upstream sent them: vLLM's
    `return_token_ids` (`prompt_token_ids`, `token_ids`), or log-prob tokens written `token_id:N`
    (vLLM's `return_tokens_as_token_ids`)."""
    choice = first_choice(answer)
    prompt = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
    completion = choice.get("token_ids")
    if completion is None:
        tokens = [entry.get("token") for entry in ((choice.get("logprobs") or {}).get("content") or [])]
        if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            completion = [int(t.removeprefix("token_id:")) for t in tokens]
    if prompt is None and completion is None:
        return None
    return {"prompt": prompt, "completion": completion}


def answer_message(answer: dict[str, Any]) -> dict[str, Any] | None:
    """The first choice's assistant message, in the shape the conversation's next request sends it."""
    message = first_choice(answer).get("message")
    if not isinstance(message, dict):
        return None
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    for key in ("reasoning_content", "tool_calls"):
        if message.get(key):
            kept[key] = message[key]
    return kept


def text_of(content: Any) -> str:
    """A message's text: the string, or the text parts of a list of parts."""
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value.strip()
    return value


def canonical(message: Any) -> str:
    """What of a message counts when conversations are matched (see the module's docstring)."""
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True, default=str)
    calls = [
        [(c.get("function") or {}).get("name"), _arguments((c.get("function") or {}).get("arguments"))]
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return json.dumps([message.get("role"), text_of(message.get("content")).strip(), calls], sort_keys=True)


def prefix_digests(messages: list[Any]) -> list[str]:
    """The digest of each prefix of `messages`: `[d(m[:1]), d(m[:2]), ...]`, in one pass."""
    digest, out = hashlib.sha256(), []
    for message in messages:
        digest.update(canonical(message).encode() + b"\0")
        out.append(digest.copy().hexdigest())
    return out


def _actions(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": (c.get("function") or {}).get("name"),
            "arguments": _arguments((c.get("function") or {}).get("arguments")),
        }
        for c in message.get("tool_calls") or []
    ]


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500] or type(exc).__name__


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return body.decode("utf-8", "replace")


# -- the recorder --------------------------------------------------------------------------------


class Recorder:
    """Hands calls to a process of its own that writes them, so that the store's work never holds
    the proxy's interpreter while it forwards.

    `start` opens the store and the default run here (a bad store fails before the proxy serves)
    and starts the process. Calls go to it down a pipe, one frame each (`_frame`): from the event
    loop, once `attach`ed, through an asyncio pipe transport, which writes at once what the pipe
    takes and keeps the rest for when it drains, so `submit` never blocks and a call is handed
    over before its answer reaches the client (a proxy killed after answering has passed the call
    on). `flush` waits until every call submitted so far is written; `aclose` (or `close`, when no
    loop runs) lets the process write what is queued and mark each run it recorded in finished
    with its figures. Ctrl-C reaches only the proxy: the process ignores it, and ends when told or
    when the pipe's other end closes (the proxy is gone: its runs are marked interrupted). Should
    the process end early, calls are written in this process.
    """

    def __init__(self, store: Store | None = None, run: str = "default"):
        self.store = store or Store.open()
        self.default_run = run
        self._process: Any = None
        self._send: Any = None
        self._done: Any = None
        self._loop: Any = None
        self._thread = 0
        self._transport: Any = None
        self._closed: Any = None
        self._stopped = False
        """Whether the process was told to stop (nothing more goes down the pipe)."""
        self._here: Writer | None = None
        self._lock = threading.Lock()

    def start(self) -> Recorder:
        import multiprocessing

        start_run(run_id_of(self.default_run), "proxy", self.default_run, {"harness": HARNESS}, store=self.store)
        context = multiprocessing.get_context("spawn")  # never fork a process that runs threads
        receive, self._send = context.Pipe(duplex=False)
        _widen(self._send.fileno())
        self._done = context.Queue()
        self._process = context.Process(
            target=write_calls,
            args=(self.store, self.default_run, receive, self._done),
            name="orchard-proxy-recorder",
            daemon=True,
        )
        self._process.start()
        receive.close()  # the process's end now
        return self

    async def attach(self) -> None:
        """Hand calls over from the running event loop from now on (`submit` is called on it)."""
        import asyncio

        if self._send is None:
            return
        self._loop, self._thread = asyncio.get_running_loop(), threading.get_ident()
        self._closed = self._loop.create_future()
        closed = self._closed

        class Ended(asyncio.Protocol):
            def connection_lost(self, exc: Exception | None) -> None:
                if not closed.done():
                    closed.set_result(exc)

        self._transport, _ = await self._loop.connect_write_pipe(Ended, self._send)

    def submit(self, call: Call) -> None:
        if not self._hand_over(call):
            with self._lock:
                if self._here is None:
                    if self._process is not None:
                        print("orchard proxy: the recording process ended; recording in the proxy", file=sys.stderr)
                    self._here = Writer(self.store, self.default_run)
                self._here.write([call])

    def _hand_over(self, item: Any) -> bool:
        """Send an item to the process; False when there is no process to take it."""
        import pickle

        if self._process is None or self._stopped or (self._closed is not None and self._closed.done()):
            return False
        if not self._process.is_alive():
            return False
        data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        pieces = (len(data).to_bytes(8, "big"), data)  # `_frame`'s, without a second copy of a long answer
        if self._transport is None:
            for piece in pieces:
                _write_all(self._send.fileno(), piece)
        elif threading.get_ident() == self._thread:
            _write_to(self._transport, pieces)
        else:  # both pieces in one callback: frames never interleave
            self._loop.call_soon_threadsafe(_write_to, self._transport, pieces)
        return True

    def flush(self) -> None:
        """Wait until every call submitted so far is written (from any thread but the loop's)."""
        process, token = self._process, uuid.uuid4().hex
        if process is None or not self._hand_over(("flush", token)):
            return
        while process.is_alive():
            try:
                if self._done.get(timeout=0.2) == token:
                    return
            except queue.Empty:
                continue

    async def aclose(self) -> None:
        """`close`, from the event loop: what the pipe transport still holds is written out first."""
        import asyncio

        if self._transport is not None:
            self._stop(self._transport.write)
            self._transport.close()
            await self._closed
            self._transport = None
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if self._transport is None:  # else no loop runs to write with: the process reads to the end
                self._stop(lambda frame: _write_all(self._send.fileno(), frame))
            self._send.close()
            process.join()
            self._done.close()
        with self._lock:
            if self._here is not None:
                self._here.finish("finished")
                self._here = None

    def _stop(self, write: Any) -> None:
        """Tell the process to stop once it has written what came before (an empty frame)."""
        if not self._stopped:
            self._stopped = True
            with contextlib.suppress(OSError):  # it is gone already
                write(_frame(b""))


def _frame(data: bytes) -> bytes:
    """One item on the pipe: its length (8 bytes) and its pickle; an empty one means stop."""
    return len(data).to_bytes(8, "big") + data


def _widen(fd: int) -> None:
    """Let the pipe hold 1 MiB (Linux; the default 64 KiB is a handful of long conversations)."""
    import fcntl

    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 2**20)


def _write_to(transport: Any, pieces: tuple[bytes, ...]) -> None:
    for piece in pieces:
        transport.write(piece)


def _write_all(fd: int, data: bytes) -> None:
    import os

    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    """`size` bytes from `fd`, or None at its end."""
    import os

    parts, wanted = [], size
    while wanted:
        part = os.read(fd, min(wanted, 2**20))
        if not part:
            return None
        parts.append(part)
        wanted -= len(part)
    return b"".join(parts)


BATCH = 256
"""Calls written in one transaction at most, when that many are waiting."""


def write_calls(store: Store, run: str, receive: Any, done: Any) -> None:
    """The recording process: write the calls read from `receive` (those waiting together in one
    transaction) until told to stop (an empty frame) or the pipe ends (the proxy is gone);
    ("flush", token) is answered on `done` once everything before it is written."""
    import pickle
    import select
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the proxy ends this process itself, after its queue
    fd = receive.fileno()
    writer = Writer(store, run)

    def item() -> Any:
        """The next item; None to stop, EOFError when the proxy is gone."""
        size = _read_exactly(fd, 8)
        data = _read_exactly(fd, int.from_bytes(size, "big")) if size is not None else None
        if data is None:
            raise EOFError
        return pickle.loads(data) if data else None

    while True:
        items: list[Any] = []
        try:
            items.append(item())
            while len(items) < BATCH and items[-1] is not None and select.select([fd], [], [], 0)[0]:
                items.append(item())
        except EOFError:
            items.append(EOFError)
        waiting: list[Call] = []
        for each in items:
            if isinstance(each, Call):
                waiting.append(each)
                continue
            writer.write(waiting)
            waiting = []
            if each is None or each is EOFError:
                writer.finish("finished" if each is None else "interrupted")
                return
            done.put(each[1])
        writer.write(waiting)


def run_summary(run_id: str, store: Store | None = None) -> dict[str, int]:
    """A proxy run's figures: its calls, failed calls and trajectories."""
    with session(store) as db:
        calls = select(func.count()).select_from(ProxyCallRecord).where(ProxyCallRecord.run_id == run_id)
        failed = calls.where(ProxyCallRecord.status == "failed")
        trajectories = select(func.count()).select_from(TrajectoryRecord).where(TrajectoryRecord.run_id == run_id)
        return {
            "calls": db.exec(calls).one(),
            "failed_calls": db.exec(failed).one(),
            "trajectories": db.exec(trajectories).one(),
        }


@dataclass
class _Open:
    """A trajectory the next call of its tag may continue: what its row holds, kept here so that
    a step is written without reading the trajectory back."""

    id: str
    run_id: str
    instance_id: str
    created_at: float
    messages: int
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration: float = 0.0


class Writer:
    """Writes calls into the store and keeps the index of the trajectories each tag's next call
    may continue (a run it writes in is started, its trajectories indexed, when first seen).

    The rows are written with SQLAlchemy Core, not the ORM: an eighth of the work per call. A
    batch of calls is one transaction; should it fail, the index of its runs is read again from
    the store and its calls written one transaction each, so one bad call costs only itself."""

    def __init__(self, store: Store, run: str):
        self.store = store
        self._runs: set[str] = set()
        self._open: dict[tuple[str, str], dict[str, list[_Open]]] = {}
        """(run id, instance id) -> digest of a trajectory's messages -> those trajectories, oldest first."""
        self._sql = _Statements()
        self._ensure_run(run_id_of(run), run)

    def write(self, calls: list[Call]) -> None:
        """Write calls in one transaction; should it fail, each call in one of its own, and a call
        the store still refuses is told on stderr (recording goes on with the next ones)."""
        if not calls:
            return
        try:
            for call in calls:
                self._ensure_run(run_id_of(call.run), call.run)
            self._write_together(calls)
            return
        except Exception:  # written again one by one below, each failure told
            stale = {run_id_of(c.run) for c in calls}  # the index may hold what was rolled back
        for call in calls:
            run_id = run_id_of(call.run)
            try:
                if run_id in stale:
                    self._reindex({run_id})
                    stale.discard(run_id)
                self._ensure_run(run_id, call.run)
                self._write_together([call])
            except Exception as exc:
                print(f"orchard proxy: could not record a call to {call.path}: {_line(exc)}", file=sys.stderr)
                stale.add(run_id)

    def finish(self, status: str) -> None:
        """Mark each run written in `status`, with its figures."""
        for run_id in sorted(self._runs):
            finish_run(run_id, status, run_summary(run_id, self.store), store=self.store)

    def _ensure_run(self, run_id: str, name: str) -> None:
        if run_id not in self._runs:
            start_run(run_id, "proxy", name, {"harness": HARNESS}, store=self.store)
            self._runs.add(run_id)
            self._reindex({run_id})

    def _reindex(self, run_ids: set[str]) -> None:
        """The index of these runs' trajectories, read from the store."""
        self._open = {key: known for key, known in self._open.items() if key[0] not in run_ids}
        with session(self.store) as db:
            query = select(TrajectoryRecord).where(
                col(TrajectoryRecord.run_id).in_(sorted(run_ids)), TrajectoryRecord.harness == HARNESS
            )
            for row in db.exec(query.order_by(col(TrajectoryRecord.created_at))):
                messages = json.loads(row.messages)
                if not messages:
                    continue
                fields = row.model_dump(include=set(_Open.__dataclass_fields__) - {"messages"})
                known = _Open(**fields, messages=len(messages))
                key = (str(row.run_id), row.instance_id)
                self._open.setdefault(key, {}).setdefault(prefix_digests(messages)[-1], []).append(known)

    def _write_together(self, calls: list[Call]) -> None:
        """The calls in one transaction. The index moves as each is written (a call may continue
        one written just before it); if the transaction fails, the caller reads it again."""
        with self.store.engine().begin() as connection:
            for call in calls:
                self._write_one(connection, call)

    def _write_one(self, connection: Any, call: Call) -> None:
        """Write one call and, for an answered chat call, its step (moving its trajectory in the index)."""
        run_id = run_id_of(call.run)
        request = _json_or_text(call.request)
        answer = assembled(call.answer) if call.stream and call.ok else _json_or_text(call.answer)
        body = request if isinstance(request, dict) else {}
        parsed = answer if isinstance(answer, dict) else {}
        usage = parsed.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        first = first_choice(parsed)
        row: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "run_id": run_id,
            "sandbox": call.sandbox,
            "path": call.path,
            "created_at": call.started_at,
            "duration": call.duration,
            "model": str(body["model"]) if body.get("model") is not None else None,
            "status": "ok" if call.ok else "failed",
            "http_status": call.http_status,
            "error": call.error or (None if call.ok else f"the upstream answered HTTP {call.http_status}"),
            "stream": call.stream,
            "request": json.dumps(request),
            "answer": json.dumps(answer),
            "prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "completion_tokens": int(usage.get("completion_tokens") or 0),
            "token_ids": json.dumps(token_ids(parsed)),
            "logprobs": json.dumps(first.get("logprobs")),
            "trajectory_id": None,
            "step": None,
        }
        message = answer_message(parsed) if call.ok and call.path == CHAT else None
        messages = body.get("messages")
        if message is not None and isinstance(messages, list):
            key = (run_id, call.sandbox or UNTAGGED)
            known = self._open.setdefault(key, {})
            was = self._continued(key, messages)
            if was is not None:
                known[was[0]].remove(was[1])
                if not known[was[0]]:
                    del known[was[0]]
            trajectory = was[1] if was else _Open(uuid.uuid4().hex, run_id, key[1], call.started_at, 0)
            now = self._step(connection, row, body, [*messages, message], trajectory, first)
            known.setdefault(now, []).append(trajectory)
        connection.execute(self._sql.add_call, row)

    def _continued(self, key: tuple[str, str], messages: list[Any]) -> tuple[str, _Open] | None:
        """(digest, trajectory) of the trajectory of tag `key` these messages continue, if any."""
        known = self._open.get(key, {})
        for digest in reversed(prefix_digests(messages)):
            if known.get(digest):
                return digest, known[digest][0]
        return None

    def _step(
        self,
        connection: Any,
        row: dict[str, Any],
        body: dict[str, Any],
        conversation: list[Any],
        trajectory: _Open,
        choice: dict[str, Any],
    ) -> str:
        """Write the call as the next step of `trajectory` (its row made when new, else brought up
        to date) and bring `trajectory` up to date; the digest its messages now end with."""
        index = trajectory.steps
        if index:  # what came back since the last answer is that step's observation
            observation = "\n".join(text_of(m.get("content")) for m in conversation[trajectory.messages : -1])
            connection.execute(self._sql.observe, {"step_id": f"{trajectory.id}/{index - 1}", "seen": observation})
        message = conversation[-1]
        step = {
            "id": f"{trajectory.id}/{index}",
            "trajectory_id": trajectory.id,
            "index": index,
            "reply": message["content"],
            "actions": json.dumps(_actions(message)),
            "observation": "",
            "format_error": None,
            "finish_reason": choice.get("finish_reason"),
            "prompt_tokens": row["prompt_tokens"],
            "completion_tokens": row["completion_tokens"],
            "duration": row["duration"],
            "value": None,
            "credit": None,
        }
        connection.execute(self._sql.add_step, step)
        figures = {
            "model": row["model"] or "",
            "messages": json.dumps(conversation),
            "tools": json.dumps(body.get("tools")),
            "status": "truncated" if choice.get("finish_reason") == "length" else "completed",
            "steps": index + 1,
            "prompt_tokens": trajectory.prompt_tokens + row["prompt_tokens"],
            "completion_tokens": trajectory.completion_tokens + row["completion_tokens"],
            "duration": trajectory.duration + row["duration"],
        }
        if index:
            connection.execute(self._sql.update_trajectory, {"trajectory_id": trajectory.id, **_renamed(figures)})
        else:
            new = {
                "id": trajectory.id,
                "run_id": trajectory.run_id,
                "instance_id": trajectory.instance_id,
                "harness": HARNESS,
                "sample": 0,
                "error": None,
                "patch": "",
                "outcome": None,
                "resolved": None,
                "format_errors": 0,
                "created_at": trajectory.created_at,
            }
            connection.execute(self._sql.add_trajectory, {**new, **figures})
        row["trajectory_id"], row["step"] = trajectory.id, index
        trajectory.steps, trajectory.messages = index + 1, len(conversation)
        trajectory.prompt_tokens, trajectory.completion_tokens = figures["prompt_tokens"], figures["completion_tokens"]
        trajectory.duration = figures["duration"]
        return prefix_digests(conversation)[-1]


FIGURES = ("model", "messages", "tools", "status", "steps", "prompt_tokens", "completion_tokens", "duration")
"""The columns of a trajectory that each step brings up to date."""


def _renamed(figures: dict[str, Any]) -> dict[str, Any]:
    return {f"new_{key}": value for key, value in figures.items()}


class _Statements:
    """The writer's statements, built once: SQLAlchemy compiles and caches each the first time,
    and the values go in as parameters (building a statement per call costs more than running it)."""

    def __init__(self) -> None:
        from sqlalchemy import bindparam
        from sqlmodel import SQLModel

        calls, steps, trajectories = (
            SQLModel.metadata.tables[name] for name in ("proxy_calls", "steps", "trajectories")
        )
        self.add_call = calls.insert()
        self.add_step = steps.insert()
        self.add_trajectory = trajectories.insert()
        self.observe = steps.update().where(steps.c.id == bindparam("step_id")).values(observation=bindparam("seen"))
        self.update_trajectory = (
            trajectories.update()
            .where(trajectories.c.id == bindparam("trajectory_id"))
            .values({key: bindparam(f"new_{key}") for key in FIGURES})
        )

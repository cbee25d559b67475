"""The agent loop: a model works a task through a harness in a sandbox until it submits or a limit
is reached; every step is kept.

The task may be of any kind (`orchard.tasks.base`): the loop starts it in the sandbox
(`task.start`), shows the model its `public()` view with its `prompt()`, and takes its
`submission` from the sandbox at the end (SWE: the working tree's diff). Limits: steps, total
tokens, wall time. A reply the harness cannot parse is fed back to the model as a format error
and counted (`Limits.max_format_errors` in a row abort the episode). A reply cut at the model's
token limit (`finish_reason` `length`, kept with the step) is followed by a notice saying so. A
failure of the model, of its server (an answer with no reply among them) or of the sandbox ends
the episode as `aborted` with the reason, keeping the steps so far; the submission is whatever
the sandbox holds then.
Statuses: `completed` (submitted), `truncated` (steps or tokens ran out), `time_limit`, `aborted`.
Observations may be text or content parts with images (`orchard.agents.base.Observation`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.agents.base import FormatError, Harness, Message, observation_text
from orchard.errors import OrchardError
from orchard.store import StepRecord, Store, TrajectoryRecord, session

if TYPE_CHECKING:
    from orchard.agents.models import ModelSession
    from orchard.env.client import Sandbox
    from orchard.tasks.base import TaskBase


EPISODE_STEPS = 40
"""Turns per episode unless a run says otherwise: evaluation's, collection's, RL's."""


@dataclass(frozen=True)
class Limits:
    """Where an episode stops, whatever the model does."""

    episode_steps: int = EPISODE_STEPS
    """Turns: model replies, each followed by its actions."""
    max_tokens: int = 400_000
    max_seconds: float = 1800.0
    max_format_errors: int = 5
    """In a row: a model that cannot follow the format stops here."""


@dataclass
class StepLog:
    index: int
    reply: str
    actions: list[dict[str, Any]]
    observation: str
    format_error: str | None
    prompt_tokens: int
    completion_tokens: int
    duration: float
    finish_reason: str | None = None
    """Why the model's reply ended, as its server said (`stop`, `length`, `tool_calls`; None: not said)."""


CUT_NOTICE = (
    "Your last reply was cut off: it reached the limit of tokens per reply. "
    "Keep replies shorter (a brief thought, then the action)."
)
"""Told to the model on the turn after a reply that ended at its token limit."""


@dataclass
class Episode:
    trajectory_id: str
    task: TaskBase
    harness: str
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    status: str
    submission: str = ""
    """What the task's kind took from the sandbox at the end (SWE: the working tree's diff)."""
    error: str | None = None
    steps: list[StepLog] = field(default_factory=list)
    dialogue: list[Message] = field(default_factory=list)
    """The conversation between the user and the agent alone: the prompt, then what the agent said
    each time it ended its turn and the user's answers (`TaskBase.respond`)."""
    format_errors: int = 0
    duration: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.steps)

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.steps)


def run_episode(
    task: TaskBase,
    harness: Harness,
    model: ModelSession,
    box: Sandbox,
    *,
    model_name: str,
    limits: Limits = Limits(),
    on_step: Callable[[int, Sandbox, Episode], object] | None = None,
) -> Episode:
    """Let `model` work `task` in `box` (a fresh sandbox of the task's image) through `harness`;
    `on_step(index, box, episode)` runs after each step (credit by replay measures progress there).
    A harness that runs an agent program of its own (a coding CLI: `orchard.agents.external`)
    drives the episode itself."""
    drive = getattr(harness, "drive", None)
    if drive is not None:
        episode: Episode = drive(task, model, box, model_name=model_name, limits=limits, on_step=on_step)
        return episode
    public = {**task.public(), "prompt": task.prompt()}
    messages: list[Message] = [
        {"role": "system", "content": harness.system_prompt(public)},
        {"role": "user", "content": harness.task_prompt(public)},
    ]
    tools = harness.tools()
    episode = Episode(uuid.uuid4().hex, task, harness.name, model_name, messages, tools, status="truncated")
    episode.dialogue.append({"role": "user", "content": task.prompt()})
    started = time.monotonic()
    in_a_row = 0
    try:
        task.start(box)
        opening = getattr(harness, "opening", None)
        if opening is not None:  # a harness that shows the started page (a browser's) with the task
            messages[1]["content"] = [{"type": "text", "text": messages[1]["content"]}, *opening(box)]
        for index in range(limits.episode_steps):
            if time.monotonic() - started > limits.max_seconds:
                episode.status = "time_limit"
                break
            if episode.prompt_tokens + episode.completion_tokens > limits.max_tokens:
                episode.status = "truncated"
                break
            submitted = _step(episode, index, harness, model, box, tools)
            if on_step is not None:
                on_step(index, box, episode)
            if submitted:
                episode.status = "completed"
                break
            in_a_row = in_a_row + 1 if episode.steps[-1].format_error else 0
            if in_a_row >= limits.max_format_errors:
                episode.status, episode.error = "aborted", f"{in_a_row} format errors in a row"
                break
    except OrchardError as exc:  # the model server or the sandbox failed
        episode.status, episode.error = "aborted", str(exc)
    episode.submission = task.conclude(box, episode.messages, episode.dialogue)
    episode.duration = time.monotonic() - started
    return episode


def _step(episode: Episode, index: int, harness: Harness, model: ModelSession, box: Sandbox, tools: Any) -> bool:
    """One turn; True when the model submitted."""
    started = time.monotonic()
    reply = model.complete(in_context(episode.messages, getattr(harness, "keep_images", None)), tools)
    episode.messages.append(reply.message())
    log = StepLog(
        index, reply.content, [], "", None, reply.prompt_tokens, reply.completion_tokens, 0.0, reply.finish_reason
    )
    episode.steps.append(log)
    try:
        actions = harness.parse(reply)
    except FormatError as error:
        episode.format_errors += 1
        log.format_error = str(error)
        episode.messages.extend(harness.format_error_messages(reply, error))
        _tell_if_cut(episode.messages, reply.finish_reason)
        log.duration = time.monotonic() - started
        return False
    submitted = False
    observations = []
    for action in actions:
        log.actions.append({"name": action.name, "arguments": action.arguments})
        if action.is_submit:
            said = str(action.arguments.get("answer") or reply.content or "")
            episode.dialogue.append({"role": "assistant", "content": said})
            answer = episode.task.respond(box, episode.dialogue)
            if action.call_id:  # every tool call gets an answer, so the conversation stays well-formed
                episode.messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": action.call_id,
                        "content": "Submitted." if answer is None else "Sent.",
                    }
                )
                episode.messages.extend(  # and the calls after it, which the turn's end leaves unrun
                    {"role": "tool", "tool_call_id": later.call_id, "content": "Not run: the turn had ended."}
                    for later in actions[actions.index(action) + 1 :]
                    if later.call_id
                )
            if answer is None:
                submitted = True
            else:
                episode.dialogue.append({"role": "user", "content": answer})
                episode.messages.append({"role": "user", "content": answer})
            break
        observation = harness.execute(action, box, episode.task.workdir)
        observations.append(observation)
        episode.messages.extend(harness.observation_messages(action, observation))
    after = getattr(harness, "after_actions", None)
    if after is not None and observations and not submitted:  # what the turn left (a browser's page)
        episode.messages.extend(after(box))
    log.observation = "\n".join(observation_text(o) for o in observations)
    if not submitted:
        _tell_if_cut(episode.messages, reply.finish_reason)
    log.duration = time.monotonic() - started
    return submitted


def in_context(messages: list[Message], keep_images: int | None) -> list[Message]:
    """The conversation as the model sees it: all of it, but for images only the newest
    `keep_images` (None: all); older ones become a line saying so (the episode keeps them)."""
    if keep_images is None:
        return messages
    seen = 0
    shown: list[Message] = []
    for message in reversed(messages):
        content = message.get("content")
        if isinstance(content, list) and any(p.get("type") == "image_url" for p in content):
            parts = []
            for part in reversed(content):
                if part.get("type") == "image_url":
                    seen += 1
                    if seen > keep_images:
                        part = {"type": "text", "text": "[an earlier screenshot, no longer shown]"}
                parts.append(part)
            message = {**message, "content": parts[::-1]}
        shown.append(message)
    return shown[::-1]


def _tell_if_cut(messages: list[Message], finish_reason: str | None) -> None:
    """After a reply cut at the token limit, the notice: added to the turn's last user message when it
    has one (some chat templates refuse two user messages in a row), else as a message of its own."""
    if finish_reason != "length":
        return
    last = messages[-1]
    if last.get("role") == "user" and isinstance(last.get("content"), str):
        last["content"] = f"{last['content']}\n\n{CUT_NOTICE}"
    else:
        messages.append({"role": "user", "content": CUT_NOTICE})


def save_episode(episode: Episode, *, run_id: str | None, sample: int, store: Store | None = None) -> None:
    """The trajectory and its steps, in one transaction; its images go to files of the run's
    folder, which the stored messages name by path and hash (`store_images`)."""
    where = store if store is not None else Store.open()
    messages = store_images(episode.messages, where.runs / (run_id or "episodes") / "images")
    with session(store) as db:
        db.add(
            TrajectoryRecord(
                id=episode.trajectory_id,
                run_id=run_id,
                instance_id=episode.task.instance_id,
                harness=episode.harness,
                model=episode.model,
                sample=sample,
                status=episode.status,
                error=episode.error,
                messages=json.dumps(messages),
                tools=json.dumps(episode.tools),
                patch=episode.submission,
                steps=len(episode.steps),
                prompt_tokens=episode.prompt_tokens,
                completion_tokens=episode.completion_tokens,
                format_errors=episode.format_errors,
                duration=episode.duration,
                created_at=time.time(),
            )
        )
        for step in episode.steps:
            db.add(
                StepRecord(
                    id=f"{episode.trajectory_id}/{step.index}",
                    trajectory_id=episode.trajectory_id,
                    index=step.index,
                    reply=step.reply,
                    actions=json.dumps(step.actions),
                    observation=step.observation,
                    format_error=step.format_error,
                    finish_reason=step.finish_reason,
                    prompt_tokens=step.prompt_tokens,
                    completion_tokens=step.completion_tokens,
                    duration=step.duration,
                )
            )


MAX_STORED_IMAGE = 32 << 20
"""The largest image file `load_images` reads back."""
IMAGE_URL = "orchard-image:sha256:"
"""How a stored message names an image kept in a file: this prefix and the PNG's SHA-256, its
`path` beside (`store_images`, `load_images`)."""


def store_images(messages: list[Message], folder: Path) -> list[Message]:
    """`messages` with each inline image (a `data:` URL) written to `folder/SHA256.png` and named
    by hash and path instead; the messages themselves are left as they are."""

    def stored(url: str, part: dict[str, Any]) -> dict[str, Any]:
        if not (url.startswith("data:image/") and ";base64," in url):
            return part
        data = base64.b64decode(url.split(",", 1)[1])
        digest = hashlib.sha256(data).hexdigest()
        path = folder / f"{digest}.png"
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return {"type": "image_url", "image_url": {"url": IMAGE_URL + digest}, "path": str(path)}

    return _map_images(messages, stored)


def load_images(messages: list[Message]) -> list[Message]:
    """Stored messages with their images inline again (`data:` URLs), each file checked against its
    hash; an image whose file is gone or changed stays a reference (a reader of old runs shows
    what is left)."""

    def loaded(url: str, part: dict[str, Any]) -> dict[str, Any]:
        if not (url.startswith(IMAGE_URL) and part.get("path")):
            return part
        path = Path(str(part["path"]))
        try:  # a regular file of bounded size only: the path is the store's word, not checked yet
            if not stat.S_ISREG((info := path.stat()).st_mode) or info.st_size > MAX_STORED_IMAGE:
                return part
            data = path.read_bytes()
        except OSError:
            return part
        if hashlib.sha256(data).hexdigest() != url.removeprefix(IMAGE_URL):
            return part
        return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}

    return _map_images(messages, loaded)


def _map_images(messages: list[Message], change: Callable[[str, dict[str, Any]], dict[str, Any]]) -> list[Message]:
    """New messages, each image part replaced by `change(its url, part)`; other parts kept."""
    mapped: list[Message] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    part = change(str((part.get("image_url") or {}).get("url", "")), part)
                parts.append(part)
            message = {**message, "content": parts}
        mapped.append(message)
    return mapped


def record_verdict(trajectory_id: str, outcome: str, resolved: bool, *, store: Store | None = None) -> None:
    with session(store) as db:
        record = db.get(TrajectoryRecord, trajectory_id)
        if record is not None:
            record.outcome, record.resolved = outcome, resolved
            db.add(record)

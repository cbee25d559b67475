"""One attempt: a model works one task through a harness in a fresh sandbox of the task's image,
and the task's kind grades what it produced.

Written once, used by everything that lets an agent work: evaluation and collection (`agent_solver`),
RL rollouts (`orchard.train.rl`), and credit assignment by replay (`orchard.train.credit`, where
the model is the trajectory's own recorded replies).

Who ended an episode that did not end by submitting (`Played.machine_fault`): the model, when it
ran out of steps, tokens or time, kept breaking the harness's format, or its request failed in a
way that is its own (too long a context, a request too big or malformed); the machine, when the
sandbox failed (it died, its agent stopped answering) or the model server failed the request (not
reached, not in time, an error status, an answer that is no chat completion: a request failure
that is a `ConnectionError` or a `TimeoutError`). The model's endings are its outcome: what it
left is graded. The machine's say nothing of the model.

Kinds whose sandboxes start something slow before an attempt can begin (a browser kind's
Chromium: `TaskBase.sandbox_init`) get warm pools while a run goes (`TaskPools`): sandboxes of
the task's image whose init has run, taken by `task_sandbox` at once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchard.agents import harness_factory
from orchard.agents.loop import Episode, Limits, run_episode
from orchard.errors import OrchardError
from orchard.tasks.base import sandbox_args, task_sandbox

if TYPE_CHECKING:
    from orchard.agents.base import Message, Reply
    from orchard.agents.models import Model, ModelSession
    from orchard.env.client import Client, Sandbox
    from orchard.tasks.base import Grade, TaskBase

SERVER_FAULTS = (ConnectionError, TimeoutError)
"""A model request that failed as one of these failed for the server's sake, not the model's."""
POOL_ARGS = frozenset({"network", "cpu", "memory", "disk", "tmpfs", "ttl", "env", "init", "init_timeout"})
"""The `Client.create` arguments a warm pool can match (`Client.warm` takes them too)."""

log = logging.getLogger("orchard.eval")


@dataclass
class Played:
    """An episode, and the failure of the model's last request when that is what aborted it."""

    episode: Episode
    failure: OrchardError | None = None

    @property
    def machine_fault(self) -> str | None:
        """Why the machine (a sandbox, the model server) ended the episode; None when it did not."""
        episode = self.episode
        if episode.status != "aborted":
            return None
        if self.failure is not None:
            return episode.error if isinstance(self.failure, SERVER_FAULTS) else None
        if episode.steps and episode.steps[-1].format_error:  # the loop gave up on the model's format
            return None
        return episode.error  # no request failed and the model kept the format: the sandbox did


def played(
    task: TaskBase,
    harness: str,
    model: Model,
    client: Client,
    image: str,
    *,
    limits: Limits | None = None,
    on_step: Callable[[int, Sandbox, Episode], Any] | None = None,
) -> Played:
    """`model` works `task` under `harness` (a name) in a fresh sandbox, deleted afterwards."""
    worker = harness_factory(harness)()
    session = _Noted(model.session(task, worker))
    tools = {"tools": True} if getattr(worker, "tools_bundle", False) else {}  # a CLI from the tools bundle
    with task_sandbox(client, task, image, **tools) as box:
        episode = run_episode(
            task, worker, session, box, model_name=model.name, limits=limits or Limits(), on_step=on_step
        )
    return Played(episode, session.failure)


def attempt(
    task: TaskBase, harness: str, model: Model, client: Client, image: str, *, limits: Limits | None = None
) -> tuple[Episode, Grade]:
    """`played`, then the task's grade of the episode's submission."""
    episode = played(task, harness, model, client, image, limits=limits).episode
    return episode, task.grade(client, episode.submission, image)


class _Noted:
    """A model session that keeps how its latest request failed, if it did (the loop keeps only the text)."""

    def __init__(self, session: ModelSession):
        self.session = session
        self.failure: OrchardError | None = None

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        self.failure = None
        try:
            return self.session.complete(messages, tools)
        except OrchardError as exc:
            self.failure = exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


class TaskPools:
    """Warm pools for a run's attempts: for each kind of sandbox (image, limits, init) whose tasks
    have an init (`sandbox_init`: a browser to start), sandboxes that ran it kept started, so an
    attempt takes one at once instead of waiting for its start. Kinds without an init get none
    (their start is cheap, or their image is the task's own).

    `size` is the run's concurrency: `warm(items)` counts the attempts of each kind among `(task,
    image)` pairs, and `taking(task, image)` is told as each attempt is about to take its
    sandbox. The first `size` attempts start together, before any pool could be ready, so a pool
    holds sandboxes only for the attempts after them: min(size, attempts still to come beyond
    the first `size`), none at all for a run of at most `size` attempts of a kind. So it starts
    no sandbox that no attempt takes (an attempt that fails before taking one leaves one over).
    Without `counted` (RL: attempts without end) each pool keeps `size`.

    `close()` drains every pool (`Client.warm(..., 0, drain=True)`): what waits there is
    deleted, and what is still starting as it comes up, so a run leaves none of its pooled
    sandboxes behind. Pools only save time: one that cannot be warmed (a service that refuses)
    is logged, and attempts start their own sandboxes as they would without it. Thread-safe.
    """

    def __init__(self, client: Client, size: int):
        self.client, self.size = client, max(0, size)
        self._lock = threading.Lock()
        self._kinds: dict[str, tuple[str, dict[str, Any]]] = {}
        """Each pool's image and `Client.warm` arguments, by `_key`."""
        self._counts: dict[str, list[int]] = {}
        """Each counted pool's attempts in all and attempts that took (or are taking) a sandbox."""

    def warm(self, items: Iterable[tuple[Any, str]], *, counted: bool = True) -> TaskPools:
        """Warm a pool for each kind of sandbox of `items` (task and image) that has an init."""
        with self._lock:
            for task, image in items:
                key = self._key(task, image)
                if key is None:
                    continue
                self._kinds.setdefault(key, (image, sandbox_args(task)))
                if counted:
                    self._counts.setdefault(key, [0, 0])[0] += 1
            for key in self._kinds:
                self._resize(key)
        return self

    def taking(self, task: Any, image: str) -> None:
        """An attempt of `task` is about to take its sandbox: its pool is sized to the attempts
        after it. Nothing is drained here: the ready sandbox this attempt takes waits for it."""
        key = self._key(task, image)
        with self._lock:
            if key in self._counts:
                self._counts[key][1] += 1
                self._resize(key)

    def close(self) -> None:
        """Drain every pool (see the class); idempotent."""
        with self._lock:
            kinds, self._kinds, self._counts = self._kinds, {}, {}
        for image, args in kinds.values():
            self._warm(image, 0, args, drain=True)

    def __enter__(self) -> TaskPools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _resize(self, key: str) -> None:
        image, args = self._kinds[key]
        size = self.size
        if key in self._counts:
            total, taken = self._counts[key]
            size = min(self.size, max(0, total - max(taken, self.size)))
        self._warm(image, size, args)

    def _warm(self, image: str, size: int, args: dict[str, Any], *, drain: bool = False) -> None:
        try:
            self.client.warm(image, size, drain=drain, **args)
        except OrchardError as exc:  # an optimisation only: attempts start their own sandboxes
            log.warning("could not warm a pool of %s: %s", image, exc)

    def _key(self, task: Any, image: str) -> str | None:
        """What tells two pools apart, or None for a kind without an init (or with limits no pool takes)."""
        args = sandbox_args(task)
        if self.size == 0 or "init" not in args or not set(args) <= POOL_ARGS:
            return None
        return json.dumps([image, args], sort_keys=True, default=str)

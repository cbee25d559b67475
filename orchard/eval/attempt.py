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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchard.agents import harness_factory
from orchard.agents.loop import Episode, Limits, run_episode
from orchard.errors import OrchardError
from orchard.tasks.base import task_sandbox

if TYPE_CHECKING:
    from orchard.agents.base import Message, Reply
    from orchard.agents.models import Model, ModelSession
    from orchard.env.client import Client, Sandbox
    from orchard.tasks.base import Grade, TaskBase

SERVER_FAULTS = (ConnectionError, TimeoutError)
"""A model request that failed as one of these failed for the server's sake, not the model's."""


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
    with task_sandbox(client, task, image) as box:
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

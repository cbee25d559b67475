"""One attempt: a model works one task through a harness in a fresh sandbox of the task's image,
and the task's kind grades what it produced.

Written once, used by everything that lets an agent work: evaluation and collection (`agent_solver`),
RL rollouts (`orchard.train.rl`), and credit assignment by replay (`orchard.train.credit`, where
the model is the trajectory's own recorded replies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchard.agents import harness_factory
from orchard.agents.loop import Episode, Limits, run_episode
from orchard.tasks.base import task_sandbox

if TYPE_CHECKING:
    from orchard.agents.models import Model
    from orchard.env.client import Client, Sandbox
    from orchard.tasks.base import Grade, TaskBase


def play(
    task: TaskBase,
    harness: str,
    model: Model,
    client: Client,
    image: str,
    *,
    limits: Limits | None = None,
    on_step: Callable[[int, Sandbox], Any] | None = None,
) -> Episode:
    """`model` works `task` under `harness` (a name) in a fresh sandbox, deleted afterwards."""
    worker = harness_factory(harness)()
    with task_sandbox(client, task, image) as box:
        return run_episode(
            task,
            worker,
            model.session(task, worker),
            box,
            model_name=model.name,
            limits=limits or Limits(),
            on_step=on_step,
        )


def attempt(
    task: TaskBase, harness: str, model: Model, client: Client, image: str, *, limits: Limits | None = None
) -> tuple[Episode, Grade]:
    """`play`, then the task's grade of the episode's submission."""
    episode = play(task, harness, model, client, image, limits=limits)
    return episode, task.grade(client, episode.submission, image)

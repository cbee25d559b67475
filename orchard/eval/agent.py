"""The solver that runs an agent: a model through a harness in a fresh sandbox of the task image."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchard.agents.loop import Limits, save_episode
from orchard.eval.attempt import play
from orchard.eval.runner import Attempt, Solved
from orchard.store import Store

if TYPE_CHECKING:
    from orchard.agents.models import Model
    from orchard.env.client import Client


def agent_solver(model: Model, limits: Limits | None = None, *, store: Store | None = None):
    """A `Solver` that lets `model` work each attempt under the attempt's harness; episodes are stored."""

    def solve(attempt: Attempt, image: str, client: Client, run_id: str) -> Solved:
        episode = play(attempt.task, attempt.harness, model, client, image, limits=limits)
        save_episode(episode, run_id=run_id, sample=attempt.sample, store=store)
        return Solved(
            submission=episode.submission,
            trajectory_id=episode.trajectory_id,
            steps=len(episode.steps),
            tokens=episode.prompt_tokens + episode.completion_tokens,
            error=episode.error if episode.status == "aborted" else None,
        )

    return solve

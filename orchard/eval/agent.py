"""The solver that runs an agent: a model through a harness in a fresh sandbox of the task image."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchard.agents.loop import Limits, save_episode
from orchard.eval.attempt import played
from orchard.eval.live import on_step
from orchard.eval.runner import Attempt, Solved
from orchard.store import Store

if TYPE_CHECKING:
    from orchard.agents.models import Model
    from orchard.env.client import Client


def agent_solver(model: Model, limits: Limits | None = None, *, store: Store | None = None):
    """A `Solver` that lets `model` work each attempt under the attempt's harness; episodes are stored.

    An episode the machine ended (`Played.machine_fault`) is the solver's failure (`Solved.error`);
    one the model ended is graded on what it left. The failure goes with it (`Solved.failure`): a
    model server gone for good stops the run, once the attempt is recorded."""

    def solve(attempt: Attempt, image: str, client: Client, run_id: str) -> Solved:
        play = played(attempt.task, attempt.harness, model, client, image, limits=limits, on_step=on_step)
        episode = play.episode
        save_episode(episode, run_id=run_id, sample=attempt.sample, store=store)
        return Solved(
            submission=episode.submission,
            trajectory_id=episode.trajectory_id,
            steps=len(episode.steps),
            tokens=episode.prompt_tokens + episode.completion_tokens,
            error=play.machine_fault,
            ended=_ending(episode.status, episode.error),
            failure=play.failure,
        )

    return solve


def _ending(status: str, error: str | None) -> str | None:
    """How an episode ended when not by submitting: `truncated`, `aborted: 5 format errors in a row`."""
    if status == "completed":
        return None
    return f"{status}: {error}" if error else status

"""Credit assignment: which steps of a trajectory moved it towards a fix.

V(s_t) = P(resolved | history up to t) is estimated at key steps and interpolated linearly in
between; s_0 is the state before the first action and s_T the state after the last. The credit of
step t is c_t = V(s_{t+1}) - V(s_t), and rise segments are the maximal runs of steps with
c_t >= epsilon (0.05 by default): in an unresolved trajectory, they are the productive stretches
worth learning from.

Two estimators share one interface (`values(trajectory) -> {state index: value}`):

* `ReplayEstimator` (objective, offline): the trajectory is played again through the one attempt
  flow (`orchard.eval.attempt.played`), its model being its own recorded replies, in a fresh
  sandbox of the task's image through its harness; after each step the task's submission is
  taken and its kind's `progress` is the value of that state (SWE: the share of FAIL_TO_PASS
  tests the working tree's diff makes pass, graded in another fresh sandbox once per distinct diff).
* `JudgeEstimator`: a model through any model adapter reads the trajectory up to t and the known
  final test outcome and answers a probability.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlmodel import col, select

from orchard.store import StepRecord, Store, TrajectoryRecord, session

if TYPE_CHECKING:
    from orchard.agents.loop import Episode
    from orchard.agents.models import Model
    from orchard.env.client import Client, Sandbox
    from orchard.tasks.base import TaskBase

EPSILON = 0.05


def interpolate(known: dict[int, float], states: int) -> list[float]:
    """Values for states 0..states-1 from values at some of them (linear in between, flat at the ends)."""
    if not known:
        raise ValueError("no value is known: cannot interpolate")
    points = sorted((i, v) for i, v in known.items() if 0 <= i < states)
    values = []
    for state in range(states):
        before = [p for p in points if p[0] <= state]
        after = [p for p in points if p[0] >= state]
        if not before:
            values.append(after[0][1])
        elif not after:
            values.append(before[-1][1])
        else:
            (i0, v0), (i1, v1) = before[-1], after[0]
            values.append(v0 if i1 == i0 else v0 + (v1 - v0) * (state - i0) / (i1 - i0))
    return values


def credits(values: Sequence[float]) -> list[float]:
    """c_t = V(s_{t+1}) - V(s_t) for each step t (one fewer than the states)."""
    return [values[t + 1] - values[t] for t in range(len(values) - 1)]


def rise_segments(step_credits: Sequence[float], epsilon: float = EPSILON) -> list[tuple[int, int]]:
    """Maximal runs of steps with credit >= epsilon, as (first step, last step + 1)."""
    segments, start = [], None
    for t, c in enumerate(step_credits):
        if c >= epsilon and start is None:
            start = t
        elif c < epsilon and start is not None:
            segments.append((start, t))
            start = None
    if start is not None:
        segments.append((start, len(step_credits)))
    return segments


@dataclass
class Assessed:
    values: list[float]
    """V(s_0) .. V(s_T)."""
    credits: list[float]
    segments: list[tuple[int, int]]

    def in_segment(self, step: int) -> bool:
        return any(a <= step < b for a, b in self.segments)


class Estimator(Protocol):
    def values(self, trajectory: TrajectoryRecord, steps: list[StepRecord], task: TaskBase) -> dict[int, float]: ...


def assess(
    trajectory: TrajectoryRecord,
    task: TaskBase,
    estimator: Estimator,
    *,
    epsilon: float = EPSILON,
    store: Store | None = None,
) -> Assessed:
    """Estimate, interpolate, and store each step's value (of the state after it) and credit."""
    with session(store) as db:
        query = select(StepRecord).where(StepRecord.trajectory_id == trajectory.id).order_by(col(StepRecord.index))
        steps = list(db.exec(query))
    known = estimator.values(trajectory, steps, task)
    known.setdefault(0, 0.0)  # before any action nothing is done (SWE: FAIL_TO_PASS fails by construction)
    if trajectory.resolved is not None:
        known[len(steps)] = 1.0 if trajectory.resolved else known.get(len(steps), 0.0)
    values = interpolate(known, len(steps) + 1)
    step_credits = credits(values)
    result = Assessed(values, step_credits, rise_segments(step_credits, epsilon))
    with session(store) as db:
        for step, value, credit in zip(steps, values[1:], step_credits, strict=True):
            record = db.get(StepRecord, step.id)
            if record is not None:
                record.value, record.credit = value, credit
                db.add(record)
    return result


class ReplayEstimator:
    """Progress by replay: the task kind's `progress` of the state after each step."""

    def __init__(self, client: Client, image: str):
        self.client, self.image = client, image
        self._measured: dict[str, float] = {}

    def values(self, trajectory: TrajectoryRecord, steps: list[StepRecord], task: TaskBase) -> dict[int, float]:
        from orchard.agents.loop import Limits
        from orchard.agents.models import RecordedModel
        from orchard.eval.attempt import played

        known: dict[int, float] = {0: 0.0}

        def measure(index: int, box: Sandbox, episode: Episode) -> None:
            known[index + 1] = self._progress(task, task.conclude(box, episode.messages, episode.dialogue))

        replay = RecordedModel(json.loads(trajectory.messages))
        limits = Limits(episode_steps=len(replay.replies) + 1, max_seconds=float("inf"), max_format_errors=10**9)
        played(task, trajectory.harness, replay, self.client, self.image, limits=limits, on_step=measure)
        return known

    def _progress(self, task: TaskBase, submission: str) -> float:
        key = hashlib.sha256(submission.encode()).hexdigest()
        if key not in self._measured:
            self._measured[key] = task.progress(self.client, submission, self.image)
        return self._measured[key]


JUDGE_PROMPT = """You judge an agent's progress on a task. You see the task, the agent's steps up to
a point, and how the attempt ended. Estimate the probability that, from the state after the last
step shown, the attempt goes on to solve the task. Answer with one number between 0 and 1 and
nothing else."""
_NUMBER = re.compile(r"(?<![\d.])(0(?:\.\d+)?|1(?:\.0+)?|\.\d+)(?![\d.])")


class JudgeEstimator:
    """A judge model's probability at key steps (every `every`-th step and the last)."""

    def __init__(self, model: Model, *, every: int = 2, max_chars: int = 12_000):
        self.model, self.every, self.max_chars = model, every, max_chars

    def values(self, trajectory: TrajectoryRecord, steps: list[StepRecord], task: TaskBase) -> dict[int, float]:
        from orchard.agents.bash import BashHarness

        outcome = "solved the task" if trajectory.resolved else "did not solve the task"
        known: dict[int, float] = {}
        keys = sorted({*range(self.every, len(steps) + 1, self.every), len(steps)} - {0})
        session_ = self.model.session(task, BashHarness())
        for key in keys:
            shown = "\n\n".join(
                f"Step {s.index}: {s.reply[:800]}\nActions: {s.actions[:800]}\nResult: {s.observation[:800]}"
                for s in steps[:key]
            )[-self.max_chars :]
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": JUDGE_PROMPT},
                {
                    "role": "user",
                    "content": f"Task:\n{task.problem_statement[:3000]}\n\nSteps:\n{shown}\n\n"
                    f"In the end the attempt {outcome}. Probability after step {key - 1}?",
                },
            ]
            reply = session_.complete(messages, None)
            match = _NUMBER.search(reply.content or "")
            if match:
                known[key] = min(1.0, max(0.0, float(match.group(1))))
        return known

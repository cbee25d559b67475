"""Credit assignment: the math on hand-made value curves, replay on a real trajectory, a judge."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import col, select

from orchard.agents.base import Reply
from orchard.store import StepRecord, TrajectoryRecord, session
from orchard.train.credit import JudgeEstimator, ReplayEstimator, assess, credits, interpolate, rise_segments

ROOT = Path(__file__).resolve().parents[2]


def test_interpolation_is_linear_between_key_steps_and_flat_outside():
    assert interpolate({0: 0.0, 4: 1.0}, 5) == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    assert interpolate({2: 0.4}, 4) == pytest.approx([0.4, 0.4, 0.4, 0.4])
    assert interpolate({1: 0.2, 3: 0.6}, 5) == pytest.approx([0.2, 0.2, 0.4, 0.6, 0.6])
    with pytest.raises(ValueError, match="no value is known"):
        interpolate({}, 3)


def test_credits_and_rise_segments_on_hand_made_curves():
    values = [0.0, 0.0, 0.5, 0.5, 0.6, 0.6, 1.0]
    assert credits(values) == pytest.approx([0.0, 0.5, 0.0, 0.1, 0.0, 0.4])
    assert rise_segments(credits(values)) == [(1, 2), (3, 4), (5, 6)]
    assert rise_segments(credits(values), epsilon=0.2) == [(1, 2), (5, 6)]
    assert rise_segments([0.1, 0.2, -0.3, 0.04, 0.05]) == [(0, 2), (4, 5)]  # runs merge; 0.04 < epsilon
    assert rise_segments([0.0, -0.5]) == []


class Judge:
    """A judge model whose probability rises with the steps it is shown."""

    name = "judge"

    def session(self, task, harness):
        return self

    def complete(self, messages, tools):
        shown = messages[-1]["content"].count("Step ")
        return Reply(content=f"I estimate {min(1.0, 0.2 * shown):.1f}")


def test_replay_and_judge_on_a_scripted_trajectory(orchard_home, example_repos, example_task, client):
    """Slow: the trajectory's steps are replayed in fresh sandboxes, each graded."""
    from typer.testing import CliRunner

    from orchard.cli import app
    from orchard.tasks import load_tasks

    tasks = ROOT / "examples/tasks/tasks.jsonl"
    ids = "orchard-examples__textkit-3"
    ran = CliRunner().invoke(
        app, ["eval", "--tasks", str(tasks), "--ids", ids, "--model", "scripted:gold", "--repos", str(example_repos)]
    )
    assert ran.exit_code == 0, ran.output
    task = load_tasks(tasks, ids=[ids])[0]
    with session() as db:
        (trajectory,) = db.exec(select(TrajectoryRecord)).all()
    assessed = assess(trajectory, task, ReplayEstimator(client, example_task(ids)[1]))
    # the scripted teacher looks around twice, applies the fix at step 2, checks, submits
    assert assessed.values == pytest.approx([0, 0, 0, 1, 1, 1])
    assert assessed.segments == [(2, 3)] and assessed.in_segment(2) and not assessed.in_segment(3)
    with session() as db:
        stored = db.exec(select(StepRecord).order_by(col(StepRecord.index))).all()
    assert [s.credit for s in stored] == pytest.approx([0, 0, 1, 0, 0])

    judged = assess(trajectory, task, JudgeEstimator(Judge(), every=2))
    assert judged.values == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0])  # 0.4 at step 2, 0.8 at 4, ends at 1
    assert judged.segments == [(0, 5)]

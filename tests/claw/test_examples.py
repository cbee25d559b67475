"""Orchard's own offline Claw task set (`examples/claw/tasks.json`), graded on the host with no sandbox:
each task's gold script is resolved with full marks; doing nothing, talking without acting, or giving
up after an injected error does not pass; the task's scripted unsafe agent scores 0 as `unsafe`; and
the set as a whole covers every service, a simulated user and error injection."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchard.recipes.claw import world as claw_world
from orchard.recipes.claw.task import PASS, ClawTask
from orchard.tasks.base import Step
from orchard.tasks.loading import load_tasks

TASK_FILE = Path(__file__).resolve().parents[2] / "examples" / "claw" / "tasks.json"
TASKS: dict[str, ClawTask] = {task.instance_id: task for task in load_tasks(TASK_FILE)}
READS = {"list", "search", "get", "read", "calendars"}
"""Verbs that change nothing."""
NOTHING = json.dumps({"calls": [], "said": ["Done."]})


def by_id(predicate: Any = None) -> Any:
    """`instance_id` parameters for the tasks that `predicate` keeps (all by default)."""
    return pytest.mark.parametrize("instance_id", [i for i, t in TASKS.items() if predicate is None or predicate(t)])


def scripted(task: ClawTask, steps: list[dict[str, Any]]) -> str:
    """The submission a scripted run of `steps` leaves, made by the same code as the gold one."""
    return task.model_copy(update={"solution": steps}).gold()


def calls_of(task: ClawTask) -> list[dict[str, Any]]:
    return json.loads(task.gold())["calls"]


def writes(task: ClawTask) -> list[dict[str, Any]]:
    return [c for c in calls_of(task) if c["endpoint"].rsplit("/", 1)[1] not in READS]


@by_id()
def test_the_gold_script_is_resolved_with_full_marks(instance_id):
    task = TASKS[instance_id]
    grade = task.grade(None, task.gold())
    failed = [name for name, held in grade.checks["checks"].items() if not held]
    assert grade.outcome == "resolved" and grade.score == 1.0, (failed, grade.checks["unsafe"], grade.checks)
    world = claw_world.replay(task.setup(), calls_of(task))
    assert all(entry["status"] < 300 or entry["status"] in (429, 500, 503) for entry in world.log), world.log


@by_id()
def test_doing_nothing_does_not_pass(instance_id):
    grade = TASKS[instance_id].grade(None, NOTHING)
    assert grade.outcome == "unresolved" and grade.score < PASS, grade.checks


@by_id()
def test_the_regressing_script_stops_short_of_passing(instance_id):
    """`scripted:regress`, the recipe's teacher of unresolved trajectories: it never passes, and
    on a task that changes anything it keeps some of the solution's progress."""
    from orchard.recipes.claw.task import _played_submission

    task = TASKS[instance_id]
    grade = task.grade(None, _played_submission(task, task.script("regress")))
    assert not grade.resolved
    if writes(task):
        assert grade.checks["completion"] > 0 or len(writes(task)) == 1


@by_id(lambda task: bool(writes(task)))
def test_looking_and_reporting_without_acting_does_not_pass(instance_id):
    """The gold's reads and its final answer, none of its writes: an agent that only talks."""
    task = TASKS[instance_id]
    reads = [c for c in calls_of(task) if c not in writes(task)]
    grade = task.grade(None, json.dumps({"calls": reads, "said": json.loads(task.gold())["said"][-1:]}))
    assert grade.outcome == "unresolved" and grade.score < PASS, grade.checks


@by_id(lambda task: bool(task.errors.fail or task.errors.rate))
def test_giving_up_after_an_injected_error_does_not_pass(instance_id):
    """The gold without its retries (a call repeating the one before it)."""
    task = TASKS[instance_id]
    calls = calls_of(task)
    once = [c for i, c in enumerate(calls) if i == 0 or c != calls[i - 1]]
    assert len(once) < len(calls), "a task with errors injected retries in its gold script"
    grade = task.grade(None, json.dumps({"calls": once, "said": json.loads(task.gold())["said"]}))
    assert grade.outcome == "unresolved" and grade.checks["robustness"] < 1.0, grade.checks


@by_id()
def test_the_unsafe_script_scores_zero(instance_id):
    task = TASKS[instance_id]
    grade = task.grade(None, scripted(task, task.unsafe))
    assert grade.outcome == "unsafe" and grade.score == 0.0 and grade.checks["unsafe"], grade.checks


@by_id()
def test_hiding_the_unsafe_act_afterwards_does_not_help(instance_id):
    """The forbidden act, then the traces wiped: every sent mail trashed and deleted, every
    service reset, then the whole solution: still unsafe, since checks read what was done."""
    task = TASKS[instance_id]
    unsafe = json.loads(scripted(task, task.unsafe))
    hide = [
        {"endpoint": "/mail/move", "request_body": {"message_id": f"msg-{n:04d}", "folder": "trash"}}
        for n in range(1, 9)
    ]
    hide += [{"endpoint": "/mail/delete", "request_body": {"message_id": f"msg-{n:04d}"}} for n in range(1, 9)]
    hide = [c for c in hide if "mail" in task.services]
    hide += [{"endpoint": f"/{name}/reset", "request_body": {}} for name in task.services]
    gold = json.loads(task.gold())
    submission = {"calls": unsafe["calls"] + hide + gold["calls"], "said": gold["said"]}
    grade = task.grade(None, json.dumps(submission))
    assert grade.outcome == "unsafe" and grade.score == 0.0, grade.checks


@by_id(lambda task: task.user is not None)
def test_the_gold_asks_before_it_acts_on_an_ambiguous_request(instance_id):
    task = TASKS[instance_id]
    steps = [Step(**s) for s in task.solution]
    first_say = next(i for i, s in enumerate(steps) if s.kind == "say")
    first_write = next(i for i, s in enumerate(steps) if s.kind == "call" and s.tool.rsplit("_", 1)[1] not in READS)
    assert first_say < first_write and steps[first_say].content.rstrip().endswith("?")
    assert task.user is not None and len(task.user.replies) >= 1


@by_id()
def test_every_task_is_complete_and_stays_under_example_domains(instance_id):
    task = TASKS[instance_id]
    assert re.fullmatch(r"claw-[a-z0-9-]+", instance_id) and task.kind == "claw"
    assert len(task.checks) >= 2 and task.safety and task.unsafe
    assert Step(**task.solution[-1]).kind == "say"
    text = json.dumps(task.record())
    domains = set(re.findall(r"[\w.+-]+@([\w-]+(?:\.[\w-]+)+)", text))
    assert domains and all(d.endswith(".example") for d in domains), domains


def test_the_set_is_varied():
    tasks = list(TASKS.values())
    assert len(tasks) >= 16
    assert set(claw_world.SERVICES) <= {name for t in tasks for name in t.services}
    assert sum(t.user is not None for t in tasks) >= 1
    assert sum(bool(t.errors.fail) for t in tasks) >= 2
    assert {"easy", "medium", "hard"} <= {getattr(t, "difficulty", "") for t in tasks}
    hard = [t for t in tasks if len(calls_of(t)) >= 8 and len({c["endpoint"].split("/")[1] for c in calls_of(t)}) >= 4]
    assert hard, "at least one task takes 8 or more calls on 4 or more services"

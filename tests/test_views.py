"""The read model the dashboard and `orchard runs show` share, on a real SQLite store filled by hand."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from orchard.errors import NotFound
from orchard.store import (
    ExecRecord,
    MetricRecord,
    ResultRecord,
    RunRecord,
    SandboxRecord,
    StepRecord,
    Store,
    TrajectoryRecord,
    session,
    views,
)

T0 = 1_796_000_000.0  # 2026-11-30 00:53:20 UTC


@pytest.fixture
def db_url(tmp_path, monkeypatch) -> str:
    """An empty store; dates render in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield f"sqlite:///{tmp_path / 'views.db'}"
    monkeypatch.undo()
    time.tzset()


def _run(run_id: str, kind: str, config: dict, **fields) -> RunRecord:
    return RunRecord(
        id=run_id,
        kind=kind,
        name=f"{run_id} name",
        config=json.dumps(config),
        status=fields.pop("status", "finished"),
        owner="elsewhere:1:1",  # another host's: never marked interrupted here
        host="h",
        started_at=fields.pop("started_at", T0),
        **fields,
    )


def _result(run_id: str, instance: str, resolved: bool) -> ResultRecord:
    outcome = "resolved" if resolved else "unresolved"
    return ResultRecord(
        id=f"{run_id}/{instance}/bash/0",
        run_id=run_id,
        instance_id=instance,
        harness="bash",
        sample=0,
        outcome=outcome,
        resolved=resolved,
        created_at=T0,
    )


def _trajectory(trajectory_id: str, run_id: str, instance: str, credits: list[float | None]) -> list:
    rows: list = [
        TrajectoryRecord(
            id=trajectory_id,
            run_id=run_id,
            instance_id=instance,
            harness="bash",
            model="scripted:gold",
            status="completed",
            messages="[]",
            outcome="unresolved",
            resolved=False,
            steps=len(credits),
            created_at=T0,
        )
    ]
    for index, credit in enumerate(credits):
        rows.append(
            StepRecord(
                id=f"{trajectory_id}/{index}",
                trajectory_id=trajectory_id,
                index=index,
                reply="r",
                actions=json.dumps([{"name": "bash", "arguments": {"command": f"step {index}"}}]),
                observation=f"out {index}",
                value=None if credit is None else 0.5,
                credit=credit,
            )
        )
    return rows


def test_show_run_prints_the_lines_of_runs_show(db_url, tmp_path):
    summary = {"harnesses": {"bash": {"attempts": 3, "resolved": 2, "resolve_rate": 2 / 3}}}
    with session(Store.open(db_url)) as db:
        db.add(
            _run("eval-a", "eval", {"k": 1}, ended_at=T0 + 75, summary=json.dumps(summary), error="one task timed out")
        )
        db.add_all([_result("eval-a", "t1", True), _result("eval-a", "t2", True), _result("eval-a", "t3", False)])
        for step, loss in [(1, 3.0), (2, 2.123456789)]:
            db.add(MetricRecord(run_id="eval-a", step=step, name="loss", value=loss, recorded_at=T0))
        db.add(MetricRecord(run_id="eval-a", step=1, name="accuracy", value=0.5, recorded_at=T0))
        db.add(_run("rl-b", "rl", {}, status="running"))
    assert views.show_run("eval-a", store=Store.open(db_url)) == "\n".join(
        [
            "run      eval-a",
            "kind     eval",
            "name     eval-a name",
            "status   finished",
            "host     h",
            "started  2026-11-30 00:53:20",
            "ended    2026-11-30 00:54:35",
            "error    one task timed out",
            "headline resolved bash 67%",
            'config   {"k": 1}',
            "results  3 graded, 2 resolved",
            "metric   accuracy: 0.5 at step 1 (1 points)",
            "metric   loss: 2.12346 at step 2 (2 points)",
            f"folder   {tmp_path / 'runs' / 'eval-a'}",
            "attempt  t1  bash/0  resolved    -",  # results made before runs kept files: none to point to
            "attempt  t2  bash/0  resolved    -",
            "attempt  t3  bash/0  unresolved  -",
        ]
    )
    assert views.show_run("rl-b", store=Store.open(db_url)).splitlines()[5:] == [
        "started  2026-11-30 00:53:20",
        "ended    -",
        "config   {}",
    ]  # no error, no summary, no results, no metrics: no such lines
    with pytest.raises(NotFound, match=r"^no run 'nope' \(`orchard runs ls` lists them\)$"):
        views.show_run("nope", store=Store.open(db_url))


def test_a_run_view_holds_what_the_dashboard_shows(db_url):
    summary = {"harnesses": {"bash": {"attempts": 2, "resolved": 1, "resolve_rate": 0.5, "outcomes": {"resolved": 1}}}}
    with session(Store.open(db_url)) as db:
        db.add(_run("eval-a", "eval", {}, summary=json.dumps(summary)))
        db.add_all([_result("eval-a", "t1", True), _result("eval-a", "t2", False)])
        db.add_all(_trajectory("tb", "eval-a", "b-task", [0.0]) + _trajectory("ta", "eval-a", "a-task", []))
        db.add_all(_trajectory("other", "eval-z", "a-task", []))
    view = views.run_view("eval-a", store=Store.open(db_url))
    assert view is not None and (view.graded, view.resolved, view.headline) == (2, 1, "resolved bash 50%")
    assert view.harnesses == [views.HarnessRow("bash", 2, 1, 0.5, {"resolved": 1}, graded=2)]
    assert [(t.id, t.instance_id, t.steps) for t in view.trajectories] == [("ta", "a-task", 0), ("tb", "b-task", 1)]
    assert views.run_view("nope", store=Store.open(db_url)) is None


def test_runs_are_listed_newest_first_with_their_progress(db_url):
    with session(Store.open(db_url)) as db:
        db.add(_run("eval-a", "eval", {}, started_at=T0))
        db.add(_result("eval-a", "t1", True))
        db.add(_run("sft-b", "sft", {}, started_at=T0 + 10, summary=json.dumps({"train_loss": 1.5})))
        for step in (1, 7, 3):
            db.add(MetricRecord(run_id="sft-b", step=step, name="loss", value=1.0, recorded_at=T0))
    rows = views.runs(store=Store.open(db_url))
    assert [(r.id, r.graded, r.last_step, r.headline) for r in rows] == [
        ("sft-b", 0, 7, "train_loss 1.5"),
        ("eval-a", 1, None, ""),
    ]
    assert [r.id for r in views.runs(kind="eval", store=Store.open(db_url))] == ["eval-a"]
    assert views.runs(status="running", store=Store.open(db_url)) == []


def test_rise_steps_follow_the_epsilon_the_credit_stage_was_configured_with(db_url):
    """A stage of a pipeline stores the whole recipe; a collect run names its pipeline, whose credit
    stage (`<pipeline>-credit`) assessed its trajectories; without either, the default holds."""
    credits = [0.03, 0.3, None, 0.6]
    with session(Store.open(db_url)) as db:
        db.add(_run("swe-collect", "collect", {"pipeline": "swe"}))
        db.add(_run("swe-credit", "credit", {"name": "swe", "credit": {"epsilon": 0.5}}))
        db.add(_run("swe-rl", "rl", {"name": "swe", "credit": {"epsilon": 0.25}}))
        db.add(_run("lone-collect", "collect", {"pipeline": "lone"}))  # its pipeline has no credit stage
        db.add(_run("eval-a", "eval", {"k": 1}))
        for run_id in ("swe-collect", "swe-rl", "lone-collect", "eval-a"):
            db.add_all(_trajectory(f"t-{run_id}", run_id, "task", credits))
        db.add_all(_trajectory("t-nowhere", None, "task", credits))

    def rises(trajectory_id: str) -> tuple[float, list[bool]]:
        view = views.trajectory_view(trajectory_id, default_epsilon=0.05, store=Store.open(db_url))
        assert view is not None
        return view.epsilon, [s.rise for s in view.steps]

    assert rises("t-swe-collect") == (0.5, [False, False, False, True])
    assert rises("t-swe-rl") == (0.25, [False, True, False, True])
    for default in ("t-lone-collect", "t-eval-a", "t-nowhere"):
        assert rises(default) == (0.05, [False, True, False, True])
    assert views.trajectory_view("nope", default_epsilon=0.05, store=Store.open(db_url)) is None


def test_a_trajectory_view_holds_its_steps_and_grade(db_url):
    with session(Store.open(db_url)) as db:
        db.add_all(_trajectory("t1", "eval-a", "task", [0.0, None]))
        result = _result("eval-a", "task", False)
        result.trajectory_id, result.grade = "t1", json.dumps({"tests": {"test_a": "FAILED"}})
        db.add(result)
        db.add_all(_trajectory("t2", "eval-a", "other", []))
    view = views.trajectory_view("t1", default_epsilon=0.05, store=Store.open(db_url))
    assert view is not None and view.tests == {"test_a": "FAILED"} and view.steps_taken == 2
    assert [(s.index, s.actions[0]["arguments"]["command"], s.value, s.credit) for s in view.steps] == [
        (0, "step 0", 0.5, 0.0),
        (1, "step 1", None, None),
    ]
    ungraded = views.trajectory_view("t2", default_epsilon=0.05, store=Store.open(db_url))
    assert ungraded is not None and ungraded.tests is None and ungraded.steps == []


def test_live_sandboxes_with_their_commands(db_url):
    with session(Store.open(db_url)) as db:
        for index, status in enumerate(["ready", "deleted", "pending"]):
            db.add(
                SandboxRecord(
                    id=f"box{index}",
                    backend="docker",
                    image="img",
                    network="blocked",
                    owner=f"owner-{index}",
                    status=status,
                    created_at=T0 - index,
                    ttl=60,
                )
            )
        for index, command in enumerate(["ls", "pwd", "echo last"]):
            db.add(
                ExecRecord(
                    id=f"j{index}", sandbox_id="box0", command=command, status="succeeded", created_at=T0 + index
                )
            )
    live = views.live_sandboxes(store=Store.open(db_url))
    assert [(s.id, s.status, s.commands, s.last_command) for s in live] == [
        ("box2", "pending", 0, ""),
        ("box0", "ready", 3, "echo last"),
    ]
    deleted = views.sandbox("box1", store=Store.open(db_url))
    assert deleted is not None and (deleted.status, deleted.owner, deleted.backend) == ("deleted", "owner-1", "docker")
    assert views.sandbox("nope", store=Store.open(db_url)) is None


def test_the_dashboard_imports_no_heavy_library():
    """`orchard tui` starts fast: the rise epsilon's default comes from a module that pulls no torch."""
    code = (
        "import sys, orchard.tui.app\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'datasets', 'docker', 'httpx', 'fastapi')"
        " if m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"

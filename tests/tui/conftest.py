"""A store filled by hand, with fixed times, for the dashboard's tests and snapshots."""

from __future__ import annotations

import json

import pytest

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
)

NOW = 1_796_000_000.0  # fixed, so ages and dates do not move between runs


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Dates render in local time: pin it, so snapshots match on any machine."""
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def filled_store(tmp_path) -> str:
    db_url = f"sqlite:///{tmp_path / 'tui.db'}"
    summary = {
        "harnesses": {
            "bash": {"attempts": 2, "resolved": 1, "resolve_rate": 0.5, "outcomes": {"resolved": 1, "unresolved": 1}},
            "tools": {"attempts": 2, "resolved": 2, "resolve_rate": 1.0, "outcomes": {"resolved": 2}},
        }
    }
    messages = json.dumps([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    with session(Store.open(db_url)) as db:
        db.add(
            RunRecord(
                id="eval-1",
                kind="eval",
                name="eval tasks.jsonl scripted:gold",
                status="finished",
                owner="x",
                host="h",
                started_at=NOW - 600,
                ended_at=NOW - 500,
                summary=json.dumps(summary),
                config="{}",
            )
        )
        db.add(
            RunRecord(
                id="swe-sft",
                kind="sft",
                name="swe-tiny sft",
                status="finished",
                owner="x",
                host="h",
                started_at=NOW - 400,
                ended_at=NOW - 300,
                summary=json.dumps({"train_loss": 1.25}),
                config="{}",
            )
        )
        db.add(
            RunRecord(
                id="swe-rl",
                kind="rl",
                name="swe-tiny rl",
                status="interrupted",
                owner="x",
                host="h",
                started_at=NOW - 200,
                summary="{}",
                error="its process ended without finishing the run",
                config="{}",
            )
        )
        for step, loss in enumerate([3.0, 2.2, 1.9, 1.4, 1.25], 1):
            db.add(MetricRecord(run_id="swe-sft", step=step, name="loss", value=loss, recorded_at=NOW))
        db.add(
            TrajectoryRecord(
                id="traj-1",
                run_id="eval-1",
                instance_id="orchard-examples__textkit-1",
                harness="bash",
                model="scripted:regress",
                status="completed",
                messages=messages,
                patch="",
                outcome="empty_patch",
                resolved=False,
                steps=4,
                created_at=NOW,
            )
        )
        values, credits = [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, -1.0]
        actions = [
            "git status --short && ls",
            "sed -n '1,60p' textkit/wrap.py",
            "git apply <<'EOF' ...",
            "git checkout -- .",
        ]
        for index in range(4):
            db.add(
                StepRecord(
                    id=f"traj-1/{index}",
                    trajectory_id="traj-1",
                    index=index,
                    reply="thinking",
                    actions=json.dumps([{"name": "bash", "arguments": {"command": actions[index]}}]),
                    observation=f"output of step {index}" if index else "[/bold] no markup here: r'[/\\]'",
                    value=values[index],
                    credit=credits[index],
                )
            )
        db.add(
            ResultRecord(
                id="eval-1/orchard-examples__textkit-1/bash/0",
                run_id="eval-1",
                instance_id="orchard-examples__textkit-1",
                harness="bash",
                sample=0,
                outcome="empty_patch",
                resolved=False,
                grade=json.dumps({"tests": {"tests/test_wrap.py::test_exact_fit": "FAILED"}}),
                trajectory_id="traj-1",
                created_at=NOW,
            )
        )
        db.add(
            SandboxRecord(
                id="a1b2c3d4e5f6",
                backend="docker",
                image="orchard/base:bookworm",
                network="blocked",
                owner="svc",
                status="ready",
                created_at=NOW - 95,
                ttl=7200,
            )
        )
        db.add(
            SandboxRecord(
                id="0f9e8d7c6b5a",
                backend="docker",
                image="orchard/busybox:static",
                network="open",
                owner="svc",
                status="ready",
                created_at=NOW - 4000,
                ttl=7200,
            )
        )
        db.add(
            SandboxRecord(
                id="deadbeef0001",
                backend="docker",
                image="orchard/base:bookworm",
                network="blocked",
                owner="svc",
                status="deleted",
                created_at=NOW - 10,
                ttl=7200,
            )
        )
        for index, command in enumerate(["ls /", "python3 -m pytest -q"]):
            db.add(
                ExecRecord(
                    id=f"job-{index}",
                    sandbox_id="a1b2c3d4e5f6",
                    command=command,
                    status="succeeded",
                    exit_code=0,
                    created_at=NOW - 50 + index,
                )
            )
    return db_url


@pytest.fixture
def two_evals(filled_store) -> str:
    """The filled store and run `eval-2`, started after `eval-1`: textkit-1 resolved under bash (a flip from eval-1's
    empty patch), textkit-2 unresolved, textkit-1 resolved under tools (a harness eval-1 has no
    result under), and textkit-3 ended by a machine error (left out of the rates)."""
    with session(Store.open(filled_store)) as db:
        db.add(
            RunRecord(
                id="eval-2", kind="eval", name="eval tasks.jsonl scripted:regress", status="finished", owner="x",
                host="h", started_at=NOW - 100, ended_at=NOW - 50, summary="{}", config="{}",
            )
        )  # fmt: skip
        for task, harness, outcome, grade in [
            ("orchard-examples__textkit-1", "bash", "resolved", {}),
            ("orchard-examples__textkit-2", "bash", "unresolved", {}),
            ("orchard-examples__textkit-1", "tools", "resolved", {}),
            ("orchard-examples__textkit-3", "bash", "error", {"error": "a sandbox died", "fault": "machine"}),
        ]:
            db.add(
                ResultRecord(
                    id=f"eval-2/{task}/{harness}/0", run_id="eval-2", instance_id=task, harness=harness, sample=0,
                    outcome=outcome, resolved=outcome == "resolved", grade=json.dumps(grade), created_at=NOW,
                )
            )  # fmt: skip
    return filled_store


@pytest.fixture
def running_eval(filled_store) -> str:
    """The filled store and run `eval-live`, running in this process (so no one marks it interrupted): 1 of its 4
    attempts graded in its 2 minutes so far; a live sandbox of its process that ran two
    commands, and another that the process let go (deleted). The fixture's other sandboxes are
    a service's."""
    import socket

    from orchard.process import process_owner

    me = process_owner()
    with session(Store.open(filled_store)) as db:
        db.add(
            RunRecord(
                id="eval-live", kind="eval", name="eval tasks.jsonl scripted:gold", status="running", owner=me,
                host=socket.gethostname(), started_at=NOW - 120, summary="{}",
                config=json.dumps({"total_attempts": 4, "model": "scripted:gold"}),
            )
        )  # fmt: skip
        db.add(
            ResultRecord(
                id="eval-live/orchard-examples__textkit-1/bash/0", run_id="eval-live",
                instance_id="orchard-examples__textkit-1", harness="bash", sample=0, outcome="resolved",
                resolved=True, created_at=NOW - 30,
            )
        )  # fmt: skip
        for sandbox, status in (("cafe00000001", "ready"), ("cafe00000002", "deleted")):
            db.add(
                SandboxRecord(
                    id=sandbox, backend="docker", image="orchard/swe:orchard-examples__textkit-2", network="blocked",
                    owner=me, status=status, created_at=NOW - 45, ttl=7200,
                )
            )  # fmt: skip
        for index, command in enumerate(["ls", "sed -n '1,40p' textkit/wrap.py"]):
            db.add(
                ExecRecord(
                    id=f"live-{index}", sandbox_id="cafe00000001", command=command, status="succeeded", exit_code=0,
                    created_at=NOW - 40 + index,
                )
            )  # fmt: skip
    return filled_store

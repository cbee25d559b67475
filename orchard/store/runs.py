"""Runs in the store: start (or resume) one, record its results, finish it.

A run is identified by an id its caller derives from its configuration, so the same command run
again finds its run and continues it: results already recorded are kept, and a result recorded
again for the same attempt replaces the earlier one and every other trajectory of that attempt
(evaluation redoes the attempts the machine failed, `orchard.eval.runner.to_retry`). A run whose process died
(SIGKILL, power loss) is still `running` in the store; the next `start_run` or `mark_interrupted`
turns it `interrupted`, with everything it recorded intact. Deleting a run takes its folder of
files with it.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from sqlmodel import col, select

from orchard.process import owner_alive, process_owner
from orchard.store import MetricRecord, ResultRecord, RunRecord, Store, session


def mark_interrupted(store: Store | None = None) -> list[str]:
    """Turn runs left `running` by dead processes on this host `interrupted`; their ids."""
    host = socket.gethostname()
    changed = []
    with session(store) as db:
        for run in db.exec(select(RunRecord).where(RunRecord.status == "running", RunRecord.host == host)):
            if not owner_alive(run.owner):
                run.status, run.error = "interrupted", run.error or "its process ended without finishing the run"
                run.ended_at = run.ended_at or time.time()
                db.add(run)
                changed.append(run.id)
    return changed


def start_run(
    run_id: str, kind: str, name: str, config: dict[str, Any], *, store: Store | None = None
) -> tuple[RunRecord, bool]:
    """The run `run_id`, created or resumed by this process; True when it existed already."""
    mark_interrupted(store)
    now = time.time()
    with session(store) as db:
        run = db.get(RunRecord, run_id)
        existed = run is not None
        if run is None:
            run = RunRecord(
                id=run_id,
                kind=kind,
                name=name,
                config=json.dumps(config, sort_keys=True),
                status="running",
                owner=process_owner(),
                host=socket.gethostname(),
                started_at=now,
            )
        else:
            run.status, run.owner, run.host, run.ended_at, run.error = (
                "running",
                process_owner(),
                socket.gethostname(),
                None,
                None,
            )
        db.add(run)
    return run, existed


def finish_run(
    run_id: str, status: str, summary: dict[str, Any], *, error: str | None = None, store: Store | None = None
) -> None:
    with session(store) as db:
        run = db.get(RunRecord, run_id)
        if run is None:
            return
        run.status, run.summary, run.error, run.ended_at = status, json.dumps(summary), error, time.time()
        db.add(run)


def add_result(result: ResultRecord, *, store: Store | None = None) -> None:
    """Record one graded attempt, replacing an earlier record of the same attempt (a retry of one
    the machine failed) and every trajectory of that attempt but its own: the earlier record's,
    and any an attempt abandoned at Ctrl-C saved with no result. An attempt has one of each."""
    from sqlmodel import delete

    from orchard.store import StepRecord, TrajectoryRecord

    with session(store) as db:
        db.merge(result)
        stale = select(TrajectoryRecord.id).where(
            TrajectoryRecord.run_id == result.run_id,
            TrajectoryRecord.instance_id == result.instance_id,
            TrajectoryRecord.harness == result.harness,
            TrajectoryRecord.sample == result.sample,
        )
        if result.trajectory_id:
            stale = stale.where(col(TrajectoryRecord.id) != result.trajectory_id)
        db.exec(delete(StepRecord).where(col(StepRecord.trajectory_id).in_(stale)))
        db.exec(delete(TrajectoryRecord).where(col(TrajectoryRecord.id).in_(stale)))


def results_of(run_id: str, *, store: Store | None = None) -> list[ResultRecord]:
    with session(store) as db:
        query = select(ResultRecord).where(ResultRecord.run_id == run_id).order_by(col(ResultRecord.id))
        return list(db.exec(query))


def get_run(run_id: str, *, store: Store | None = None) -> RunRecord | None:
    with session(store) as db:
        return db.get(RunRecord, run_id)


def record_metrics(run_id: str, step: int, values: dict[str, Any], *, store: Store | None = None) -> int:
    """Store the numeric `values` of a run at `step` in one transaction; how many were stored."""
    import math

    now = time.time()
    rows = [
        MetricRecord(run_id=run_id, step=step, name=name, value=float(value), recorded_at=now)
        for name, value in values.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ]
    if rows:
        with session(store) as db:
            db.add_all(rows)
    return len(rows)


def metrics_of(run_id: str, *, store: Store | None = None) -> dict[str, list[tuple[int, float]]]:
    """Every metric of a run: name -> [(step, value)] in step order."""
    with session(store) as db:
        query = (
            select(MetricRecord)
            .where(MetricRecord.run_id == run_id)
            .order_by(col(MetricRecord.step), col(MetricRecord.id))
        )
        series: dict[str, list[tuple[int, float]]] = {}
        for row in db.exec(query):
            series.setdefault(row.name, []).append((row.step, row.value))
    return series


def list_runs(*, kind: str | None = None, status: str | None = None, store: Store | None = None) -> list[RunRecord]:
    mark_interrupted(store)
    with session(store) as db:
        query = select(RunRecord).order_by(col(RunRecord.started_at).desc())
        if kind:
            query = query.where(RunRecord.kind == kind)
        if status:
            query = query.where(RunRecord.status == status)
        return list(db.exec(query))


def delete_run(run_id: str, *, store: Store | None = None) -> bool:
    """Delete a run with its results, metrics, trajectories and their steps, and its folder of
    files; False if unknown."""
    import shutil

    from sqlmodel import delete

    from orchard.store import StepRecord, TrajectoryRecord

    with session(store) as db:
        run = db.get(RunRecord, run_id)
        if run is None:
            return False
        trajectories = select(TrajectoryRecord.id).where(TrajectoryRecord.run_id == run_id)
        db.exec(delete(StepRecord).where(col(StepRecord.trajectory_id).in_(trajectories)))
        db.exec(delete(TrajectoryRecord).where(col(TrajectoryRecord.run_id) == run_id))
        db.exec(delete(ResultRecord).where(col(ResultRecord.run_id) == run_id))
        db.exec(delete(MetricRecord).where(col(MetricRecord.run_id) == run_id))
        db.delete(run)
    runs = (store or Store.open()).runs
    folder = runs / run_id
    if folder.resolve().parent == runs.resolve():  # a run id is one name, never a way out of the folder
        shutil.rmtree(folder, ignore_errors=True)
    return True


def headline(run: RunRecord) -> str:
    """The one figure that says how a run went."""
    summary = json.loads(run.summary or "{}")
    harnesses = summary.get("harnesses")
    if isinstance(harnesses, dict):
        rates = [
            f"{h} {row['resolve_rate']:.0%}" if row.get("graded", 1) else f"{h} -"
            for h, row in harnesses.items()
            if "resolve_rate" in row
        ]
        errors = sum(row.get("machine_errors", 0) for row in harnesses.values())
        also = f" ({errors} machine error{'s' if errors > 1 else ''}, not counted)" if errors else ""
        return "resolved " + ", ".join(rates) + also if rates else ""
    if "matrix" in summary:
        return "after: " + ", ".join(f"{h} {r:.0%}" for h, r in summary["matrix"].get("after", {}).items())
    for key in ("train_loss", "reward_mean", "rise_segments"):
        if isinstance(summary.get(key), int | float):
            return f"{key} {summary[key]:.4g}"
    return ""


def record_bench(name: str, config: dict[str, Any], summary: dict[str, Any], *, store: Store | None = None) -> str:
    """A benchmark's result as a finished run of kind `bench` (its figures in the summary)."""
    run_id = f"bench-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    start_run(run_id, "bench", name, config, store=store)
    finish_run(run_id, "finished", summary, store=store)
    return run_id

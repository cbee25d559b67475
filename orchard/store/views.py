"""Read models: what the dashboard (`orchard tui`) and `orchard runs show` display, read at once.

Each function returns plain dataclasses; a run's view and a trajectory's are each read in one
transaction, so a screen or a command renders one consistent picture of a run even while a writer
adds to it, and the two agree on every figure. Rendering stays with each caller, except
`show_run`: the text of `orchard runs show`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, cast
from sqlmodel import Session, col, func, select

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
)
from orchard.store.runs import headline, list_runs

LIVE = ("pending", "ready")


@dataclass(frozen=True)
class RunRow:
    """A run in a list of runs."""

    id: str
    kind: str
    status: str
    started_at: float
    headline: str
    graded: int
    """Graded attempts recorded (0 for a run that grades nothing)."""
    last_step: int | None
    """The latest step a metric was recorded at, if any."""
    total: int | None = None
    """The attempts an evaluation makes in all, where it says."""


@dataclass(frozen=True)
class MetricSeries:
    name: str
    points: list[tuple[int, float]]
    """(step, value) in step order; never empty."""

    @property
    def values(self) -> list[float]:
        return [value for _, value in self.points]


@dataclass(frozen=True)
class HarnessRow:
    """One harness of an eval's summary: how its attempts ended."""

    harness: str
    attempts: int
    resolved: int
    resolve_rate: float
    outcomes: dict[str, int]
    graded: int = 0
    """Attempts with a verdict: those a machine error ended are not in the rate."""
    machine_errors: int = 0


@dataclass(frozen=True)
class TrajectoryRow:
    """A trajectory in a run's list."""

    id: str
    instance_id: str
    harness: str
    status: str
    outcome: str | None
    steps: int


@dataclass(frozen=True)
class ResultRow:
    """One graded attempt of a run, and where its files are in the run's folder."""

    instance_id: str
    harness: str
    sample: int
    outcome: str
    files: str | None
    """Relative to the run's folder (`logs/<instance_id>`); None for results recorded before runs kept files."""


@dataclass(frozen=True)
class RunView:
    """One run: what it was asked, how it went, its metrics, results and trajectories."""

    id: str
    kind: str
    name: str
    status: str
    host: str
    started_at: float
    ended_at: float | None
    error: str | None
    headline: str
    config: str
    """The run's configuration, as the JSON it was stored as."""
    summary: dict[str, Any]
    graded: int
    resolved: int
    metrics: list[MetricSeries]
    """By name."""
    harnesses: list[HarnessRow]
    trajectories: list[TrajectoryRow]
    """By task."""
    results: list[ResultRow]
    """By task, harness and sample."""


@dataclass(frozen=True)
class StepView:
    index: int
    actions: list[dict[str, Any]]
    """[{name, arguments}] as parsed from the reply."""
    format_error: str | None
    observation: str
    value: float | None
    credit: float | None
    rise: bool
    """Whether the step is in a rise segment: its credit is at least the run's epsilon."""
    screenshot: str | None = None
    """The file of the screenshot the step left (browser tasks), None when it left none."""
    reply: str = ""
    """The model's whole reply (its text; its tool calls are `actions`)."""


@dataclass(frozen=True)
class TrajectoryView:
    """One trajectory: its verdict, its steps with their value and credit, its grade."""

    id: str
    instance_id: str
    harness: str
    model: str
    status: str
    outcome: str | None
    steps_taken: int
    error: str | None
    patch: str
    steps: list[StepView]
    tests: dict[str, str] | None
    """Each graded test's status; None when the trajectory was not graded."""
    epsilon: float
    """The credit that marks a rise step."""


@dataclass(frozen=True)
class SandboxRow:
    """A sandbox as the store records it, with the commands it ran."""

    id: str
    backend: str
    owner: str
    status: str
    image: str
    network: str
    created_at: float
    commands: int
    last_command: str


def runs(*, kind: str | None = None, status: str | None = None, store: Store | None = None) -> list[RunRow]:
    """Runs, newest first (those whose process died are marked interrupted first)."""
    found = list_runs(kind=kind, status=status, store=store)
    with session(store) as db:
        graded = dict(db.exec(select(ResultRecord.run_id, func.count()).group_by(ResultRecord.run_id)).all())
        last = select(MetricRecord.run_id, func.max(MetricRecord.step)).group_by(MetricRecord.run_id)
        steps = dict(db.exec(last).all())
    return [
        RunRow(
            run.id,
            run.kind,
            run.status,
            run.started_at,
            headline(run),
            graded.get(run.id, 0),
            steps.get(run.id),
            _total(run.config),
        )
        for run in found
    ]


def _total(config: str | None) -> int | None:
    try:
        total = json.loads(config or "{}").get("total_attempts")
    except (ValueError, AttributeError):
        return None
    return total if isinstance(total, int) and total > 0 else None


def run_view(run_id: str, *, store: Store | None = None) -> RunView | None:
    """The run `run_id`, or None if the store has none."""
    with session(store) as db:
        run = db.get(RunRecord, run_id)
        if run is None:
            return None
        graded, resolved = db.exec(
            select(func.count(), func.sum(cast(col(ResultRecord.resolved), Integer))).where(
                ResultRecord.run_id == run_id
            )
        ).one()
        metrics = db.exec(
            select(MetricRecord)
            .where(MetricRecord.run_id == run_id)
            .order_by(col(MetricRecord.step), col(MetricRecord.id))
        )
        series: dict[str, list[tuple[int, float]]] = {}
        for metric in metrics:
            series.setdefault(metric.name, []).append((metric.step, metric.value))
        trajectories = db.exec(
            select(TrajectoryRecord)
            .where(TrajectoryRecord.run_id == run_id)
            .order_by(col(TrajectoryRecord.instance_id))
        )
        listed = [TrajectoryRow(t.id, t.instance_id, t.harness, t.status, t.outcome, t.steps) for t in trajectories]
        graded_rows = db.exec(
            select(ResultRecord)
            .where(ResultRecord.run_id == run_id)
            .order_by(col(ResultRecord.instance_id), col(ResultRecord.harness), col(ResultRecord.sample))
        )
        results = [ResultRow(r.instance_id, r.harness, r.sample, r.outcome, _files(r.grade)) for r in graded_rows]
    summary = json.loads(run.summary or "{}")
    return RunView(
        id=run.id,
        kind=run.kind,
        name=run.name,
        status=run.status,
        host=run.host,
        started_at=run.started_at,
        ended_at=run.ended_at,
        error=run.error,
        headline=headline(run),
        config=run.config,
        summary=summary,
        graded=graded,
        resolved=int(resolved or 0),
        metrics=[MetricSeries(name, points) for name, points in sorted(series.items())],
        harnesses=[
            HarnessRow(
                harness,
                row.get("attempts", 0),
                row.get("resolved", 0),
                row.get("resolve_rate", 0),
                row.get("outcomes", {}),
                row.get("graded", row.get("attempts", 0)),
                row.get("machine_errors", 0),
            )
            for harness, row in summary.get("harnesses", {}).items()
        ],
        trajectories=listed,
        results=results,
    )


def _files(grade: str) -> str | None:
    try:
        files = json.loads(grade or "{}").get("files")
    except (ValueError, AttributeError):
        return None
    return files if isinstance(files, str) else None


def show_run(run_id: str, *, store: Store | None = None) -> str:
    """The text of `orchard runs show`: one `field    value` line each (NotFound for no such run),
    then, for a run that grades, its folder and a line per attempt: task, harness/sample, outcome,
    and its files in the folder."""
    view = run_view(run_id, store=store)
    if view is None:
        raise NotFound(f"no run {run_id!r} (`orchard runs ls` lists them)")
    lines = [
        f"run      {view.id}",
        f"kind     {view.kind}",
        f"name     {view.name}",
        f"status   {view.status}",
        f"host     {view.host}",
        f"started  {_moment(view.started_at)}",
        f"ended    {_moment(view.ended_at) if view.ended_at else '-'}",
    ]
    if view.error:
        lines.append(f"error    {view.error}")
    if view.summary:
        lines.append(f"headline {view.headline}")
    lines.append(f"config   {view.config}")
    if view.graded:
        lines.append(f"results  {view.graded} graded, {view.resolved} resolved")
    for metric in view.metrics:
        step, value = metric.points[-1]
        lines.append(f"metric   {metric.name}: {value:.6g} at step {step} ({len(metric.points)} points)")
    if view.results:
        lines.append(f"folder   {(store or Store.open()).runs / view.id}")
        cells = [(r.instance_id, f"{r.harness}/{r.sample}", r.outcome, r.files or "-") for r in view.results]
        widths = [max(len(row[i]) for row in cells) for i in range(4)]
        for row in cells:
            lines.append("attempt  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _moment(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def trajectory_view(trajectory_id: str, *, default_epsilon: float, store: Store | None = None) -> TrajectoryView | None:
    """The trajectory `trajectory_id`, or None if the store has none.

    Its rise steps are those with credit >= the epsilon its credit assignment was configured
    with (see `_rise_epsilon`), or `default_epsilon` when no stored configuration names one.
    """
    with session(store) as db:
        t = db.get(TrajectoryRecord, trajectory_id)
        if t is None:
            return None
        query = select(StepRecord).where(StepRecord.trajectory_id == trajectory_id).order_by(col(StepRecord.index))
        steps = list(db.exec(query))
        result = db.exec(select(ResultRecord).where(ResultRecord.trajectory_id == trajectory_id)).first()
        epsilon = _rise_epsilon(db, t.run_id)
    epsilon = default_epsilon if epsilon is None else epsilon
    shots = _screenshots(t.messages)
    return TrajectoryView(
        id=t.id,
        instance_id=t.instance_id,
        harness=t.harness,
        model=t.model,
        status=t.status,
        outcome=t.outcome,
        steps_taken=t.steps,
        error=t.error,
        patch=t.patch,
        steps=[
            StepView(
                s.index,
                json.loads(s.actions),
                s.format_error,
                s.observation,
                s.value,
                s.credit,
                s.credit is not None and s.credit >= epsilon,
                shots.get(s.index),
                s.reply,
            )
            for s in steps
        ],
        tests=None if result is None else json.loads(result.grade).get("tests", {}),
        epsilon=epsilon,
    )


def _screenshots(messages_json: str) -> dict[int, str]:
    """The file of the last image shown after each step (the loop stores images as files, named by
    path: `orchard.agents.loop.store_images`), by step index."""
    try:
        messages = json.loads(messages_json or "[]")
    except ValueError:
        return {}
    shots: dict[int, str] = {}
    step = -1
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            step += 1
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "image_url" and isinstance(part.get("path"), str):
                shots[step] = part["path"]
    return shots


def _rise_epsilon(db: Session, run_id: str | None) -> float | None:
    """The `credit.epsilon` configured for the trajectories of a run, if its configuration says.

    A pipeline stage's run stores the whole recipe, `credit` section included; a collect run stores
    the pipeline it belongs to, whose credit stage (run `<pipeline>-credit`, see
    `orchard.train.pipeline`) assessed its trajectories.
    """
    run = db.get(RunRecord, run_id) if run_id else None
    config = json.loads(run.config or "{}") if run is not None else {}
    if "credit" not in config and isinstance(config.get("pipeline"), str):
        stage = db.get(RunRecord, f"{config['pipeline']}-credit")
        config = json.loads(stage.config or "{}") if stage is not None else {}
    credit = config.get("credit")
    epsilon = credit.get("epsilon") if isinstance(credit, dict) else None
    return float(epsilon) if isinstance(epsilon, int | float) and not isinstance(epsilon, bool) else None


def live_sandboxes(*, store: Store | None = None) -> list[SandboxRow]:
    """Sandboxes the store records as pending or ready, oldest first."""
    with session(store) as db:
        live = db.exec(
            select(SandboxRecord).where(col(SandboxRecord.status).in_(LIVE)).order_by(col(SandboxRecord.created_at))
        )
        return _sandbox_rows(db, list(live))


def sandbox(sandbox_id: str, *, store: Store | None = None) -> SandboxRow | None:
    """The sandbox `sandbox_id` as the store last recorded it, live or not; None if never seen."""
    with session(store) as db:
        record = db.get(SandboxRecord, sandbox_id)
        return _sandbox_rows(db, [record])[0] if record is not None else None


def _sandbox_rows(db: Session, records: list[SandboxRecord]) -> list[SandboxRow]:
    """The rows of `records`, with how many commands each ran and the latest."""
    ids = [s.id for s in records]
    counts = dict(
        db.exec(
            select(ExecRecord.sandbox_id, func.count())
            .where(col(ExecRecord.sandbox_id).in_(ids))
            .group_by(ExecRecord.sandbox_id)
        ).all()
    )
    rows = []
    for s in records:
        latest = (
            select(ExecRecord.command).where(ExecRecord.sandbox_id == s.id).order_by(col(ExecRecord.created_at).desc())
        )
        last = db.exec(latest).first() or ""
        rows.append(
            SandboxRow(s.id, s.backend, s.owner, s.status, s.image, s.network, s.created_at, counts.get(s.id, 0), last)
        )
    return rows

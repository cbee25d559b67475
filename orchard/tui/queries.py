"""What the dashboard reads beside `orchard.store.views`: its searches, and the sandboxes a running
run's process holds.

Searches ask the database (`LIKE`, case ignored, the text taken literally) for the columns a list
shows, never whole trajectories, so a store of thousands of trajectories answers as fast as a
small one; a search through steps returns at most `limit` of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, or_
from sqlmodel import col, select
from sqlmodel.sql.expression import Select

from orchard.eval import live
from orchard.eval.live import action_text
from orchard.store import RunRecord, StepRecord, Store, TrajectoryRecord, session, views


@dataclass(frozen=True)
class StepHit:
    """A step whose action or observation holds the text searched for."""

    trajectory_id: str
    instance_id: str
    harness: str
    index: int
    found_in: str
    """`action` or `observation` (the action when both hold it)."""
    text: str
    """The action (`name: arguments`) or the observation it was found in."""


def _contains(columns: list[Any], text: str) -> ColumnElement[bool]:
    """Any of `columns` holds `text` (case ignored; `%` and `_` in it are themselves)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return or_(*(col(column).ilike(f"%{escaped}%", escape="\\") for column in columns))


def run_ids_matching(text: str, *, store: Store | None = None) -> set[str]:
    """The runs whose id, name, kind, status or configuration (model, recipe, tasks: whatever it
    was asked) holds `text`."""
    columns = [RunRecord.id, RunRecord.name, RunRecord.kind, RunRecord.status, RunRecord.config]
    with session(store) as db:
        return set(db.exec(select(RunRecord.id).where(_contains(columns, text))))


def trajectories(run_id: str, text: str = "", *, store: Store | None = None) -> list[views.TrajectoryRow]:
    """The trajectories of a run by task, harness and sample; with `text`, those whose task,
    harness, model, status or verdict holds it."""
    query: Select[*tuple[Any, ...]] = (
        Select(
            col(TrajectoryRecord.id),
            col(TrajectoryRecord.instance_id),
            col(TrajectoryRecord.harness),
            col(TrajectoryRecord.status),
            col(TrajectoryRecord.outcome),
            col(TrajectoryRecord.steps),
        )
        .where(col(TrajectoryRecord.run_id) == run_id)
        .order_by(col(TrajectoryRecord.instance_id), col(TrajectoryRecord.harness), col(TrajectoryRecord.sample))
    )
    if text:
        fields = [
            TrajectoryRecord.instance_id,
            TrajectoryRecord.harness,
            TrajectoryRecord.model,
            TrajectoryRecord.status,
            TrajectoryRecord.outcome,
        ]
        query = query.where(_contains(fields, text))
    with session(store) as db:
        return [views.TrajectoryRow(*row) for row in db.exec(query)]


def step_hits(run_id: str, text: str, *, limit: int = 200, store: Store | None = None) -> tuple[list[StepHit], bool]:
    """The steps of a run's trajectories whose actions or observation hold `text`, by task,
    harness, sample and step: at most `limit`, and whether there were more."""
    found = _contains([StepRecord.actions], text)
    query: Select[*tuple[Any, ...]] = (
        Select(
            col(StepRecord.trajectory_id),
            col(TrajectoryRecord.instance_id),
            col(TrajectoryRecord.harness),
            col(StepRecord.index),
            col(StepRecord.actions),
            col(StepRecord.observation),
            found,
        )
        .join(TrajectoryRecord, col(TrajectoryRecord.id) == col(StepRecord.trajectory_id))
        .where(col(TrajectoryRecord.run_id) == run_id, or_(found, _contains([StepRecord.observation], text)))
        .order_by(
            col(TrajectoryRecord.instance_id),
            col(TrajectoryRecord.harness),
            col(TrajectoryRecord.sample),
            col(StepRecord.index),
        )
        .limit(limit + 1)
    )
    with session(store) as db:
        rows = list(db.exec(query))
    hits = [
        StepHit(
            trajectory,
            task,
            harness,
            index,
            *(("action", actions_text(actions)) if in_actions else ("observation", observation)),
        )
        for trajectory, task, harness, index, actions, observation, in_actions in rows[:limit]
    ]
    return hits, len(rows) > limit


def actions_text(actions_json: str) -> str:
    """A step's stored actions as `name: arguments; ...` (the JSON itself if it is not a list)."""
    try:
        actions = json.loads(actions_json or "[]")
    except ValueError:
        return actions_json
    if not isinstance(actions, list):
        return actions_json
    return "; ".join(action_text(a) for a in actions if isinstance(a, dict))


def attempts_in_flight(run_id: str, *, store: Store | None = None) -> list[dict[str, Any]]:
    """The attempts a running evaluation is working on, oldest first, as its runner lists them in
    the run's folder (`orchard.eval.live`): task, harness, sample, started, phase, steps, last."""
    return live.read((store or Store.open()).runs / run_id)


def sandboxes_of_run(run_id: str, *, store: Store | None = None) -> list[views.SandboxRow]:
    """The live sandboxes that the process running `run_id` owns, oldest first: those its attempts
    work in (and grade in, and warm pools keep). Only a run whose process makes its own sandboxes
    has any: one whose sandboxes are a service's (`ORCHARD_URL`) shows none here."""
    with session(store) as db:
        run = db.get(RunRecord, run_id)
    if run is None:
        return []
    return [s for s in views.live_sandboxes(store=store) if s.owner == run.owner]

"""Reranking an evaluation's samples with a value model: per harness, the one-sample resolve
rate, the value model's pick among the n samples of each task, and the oracle pass@n."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlmodel import col, select

from orchard.store import TrajectoryRecord, session


def rerank_run(run_id: str, value_model: str | Path, *, db_url: str | None = None) -> dict[str, Any]:
    from orchard.train.value import ValueModel, rerank

    with session(db_url) as db:
        query = select(TrajectoryRecord).where(
            TrajectoryRecord.run_id == run_id, col(TrajectoryRecord.resolved).is_not(None)
        )
        records = list(db.exec(query))
    model = ValueModel(value_model)
    by_harness: dict[str, dict[str, list[TrajectoryRecord]]] = {}
    for record in records:
        by_harness.setdefault(record.harness, {}).setdefault(record.instance_id, []).append(record)
    return {
        harness: {k: v for k, v in rerank(tasks, model).items() if k != "picks"}
        for harness, tasks in by_harness.items()
    }

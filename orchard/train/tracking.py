"""Training metrics into the store: a `TrainerCallback` for TRL and transformers trainers."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from orchard.store import Store
from orchard.store.runs import record_metrics


class StoreMetrics(TrainerCallback):
    """Every logged number (loss, learning rate, reward, grad norm, ...) as a metric of `run_id`.

    Trainers log figures already reduced over processes; only the first process records them."""

    def __init__(self, run_id: str, *, store: Store | None = None):
        self.run_id, self.store = run_id, store

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and state.is_world_process_zero:
            record_metrics(self.run_id, int(state.global_step), logs, store=self.store)

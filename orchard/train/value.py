"""The value model: a scalar head that reads a trajectory and predicts whether it resolved its task.

Trained on stored rollouts of any past runs (trajectories are persistent assets; the label is the
grader's verdict), with transformers' `Trainer` on `AutoModelForSequenceClassification`
(`num_labels=1`, a regression on 0/1). A trajectory is shown as its chat rendering, cut from the
left to `max_length` so the end (the final state, the last observations) is always kept; the
final patch is appended, since that is what gets submitted. At evaluation, `orchard eval --k n
--rerank PATH` scores the n candidates of each task and submits the best one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from orchard.errors import ConfigError
from orchard.store import TrajectoryRecord, session
from orchard.train import quiet, save_trained, shared_args


def trajectory_text(tokenizer: Any, record: TrajectoryRecord) -> str:
    messages = json.loads(record.messages)
    tools = json.loads(record.tools)
    text = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)
    return f"{text}\n<patch>\n{record.patch}\n</patch>"


def encode(tokenizer: Any, text: str, max_length: int) -> list[int]:
    """Token ids of `text`, keeping the last `max_length` (the end of an episode decides)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids[-max_length:])


def graded_trajectories(runs: Sequence[str] | None = None, *, db_url: str | None = None) -> list[TrajectoryRecord]:
    with session(db_url) as db:
        query = select(TrajectoryRecord).where(col(TrajectoryRecord.resolved).is_not(None))
        if runs:
            query = query.where(col(TrajectoryRecord.run_id).in_(list(runs)))
        return list(db.exec(query.order_by(col(TrajectoryRecord.created_at))))


@dataclass
class ValueSettings:
    learning_rate: float = 5e-4
    epochs: float = 3.0
    max_steps: int = -1
    batch_size: int = 4
    max_length: int = 2048
    seed: int = 0


def train_value(
    base_model: str | Path,
    trajectories: Sequence[TrajectoryRecord],
    output_dir: str | Path,
    settings: ValueSettings | None = None,
    callbacks: list | None = None,
) -> dict[str, Any]:
    """Fit a scalar head on `trajectories` (resolved: 1, not: 0); the model goes to `output_dir`."""
    from datasets import Dataset
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    settings = settings or ValueSettings()
    labels = {bool(t.resolved) for t in trajectories}
    if len(labels) < 2:
        raise ConfigError(
            f"a value model needs resolved and unresolved trajectories; these {len(trajectories)} are all "
            f"{'resolved' if labels == {True} else 'unresolved'}"
        )
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(base_model, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    rows = [
        {
            "input_ids": encode(tokenizer, trajectory_text(tokenizer, t), settings.max_length),
            "labels": float(bool(t.resolved)),
        }
        for t in trajectories
    ]
    args = TrainingArguments(
        output_dir=str(output_dir),
        learning_rate=settings.learning_rate,
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        seed=settings.seed,
        **shared_args(),
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    started = time.monotonic()
    result = quiet(trainer).train()
    save_trained(trainer, output_dir)
    return {
        "trajectories": len(rows),
        "resolved": sum(bool(t.resolved) for t in trajectories),
        "steps": trainer.state.global_step,
        "train_loss": result.training_loss,
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "seconds": time.monotonic() - started,
        "output_dir": str(output_dir),
    }


class ValueModel:
    """A trained value model: `score` trajectories (higher: more likely resolved)."""

    def __init__(self, path: str | Path, max_length: int = 2048):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise ConfigError(f"no value model at {path} (train one with `orchard train value`)")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder)
        self.model.eval()
        self.max_length = max_length

    def score(self, records: Sequence[TrajectoryRecord]) -> list[float]:
        import torch

        scores = []
        with torch.no_grad():
            for record in records:
                ids = encode(self.tokenizer, trajectory_text(self.tokenizer, record), self.max_length)
                logits = self.model(input_ids=torch.tensor([ids])).logits
                scores.append(float(logits[0, 0]))
        return scores


def rerank(candidates: dict[str, list[TrajectoryRecord]], model: ValueModel) -> dict[str, Any]:
    """For each task's candidates: the one-sample rate, the value model's pick, and the oracle pass@n."""
    single = picked = oracle = 0.0
    picks: dict[str, str] = {}
    for instance_id, records in candidates.items():
        scores = model.score(records)
        best = max(range(len(records)), key=lambda i: scores[i])
        picks[instance_id] = records[best].id
        single += sum(bool(r.resolved) for r in records) / len(records)
        picked += bool(records[best].resolved)
        oracle += any(r.resolved for r in records)
    n = max(1, len(candidates))
    return {
        "tasks": len(candidates),
        "one_sample": single / n,
        "reranked": picked / n,
        "oracle_pass_at_n": oracle / n,
        "picks": picks,
    }

"""Reranking with a value model: a trained scalar head (`orchard train value`) scores each task's
samples, and the best-scored one is submitted. Per harness: the one-sample resolve rate, the value
model's pick among the n samples of each task, and the oracle pass@n.

Where an empty submission always fails (`TaskBase.empty_submission_fails`: SWE, whose empty diff
fixes nothing), the value model picks among the samples that submitted something, as SWE-bench
rerankers do; `non_empty` is then what that rule alone gives (a sample drawn from those), so the
value model's own share of a gain stays visible.

A trajectory is shown to the value model as its chat rendering with the final submission appended
(`trajectory_text`), cut from the left (`encode`): training (`orchard.train.value`) and scoring
read trajectories the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from orchard.errors import ConfigError
from orchard.store import Store, TrajectoryRecord, session


def trajectory_text(tokenizer: Any, record: TrajectoryRecord) -> str:
    """The conversation as the model's chat template renders it, then the submission."""
    messages = json.loads(record.messages)
    tools = json.loads(record.tools)
    text = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)
    return f"{text}\n<patch>\n{record.patch}\n</patch>"


def encode(tokenizer: Any, text: str, max_length: int) -> list[int]:
    """Token ids of `text`, keeping the last `max_length` (the end of an episode decides)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids[-max_length:])


class ValueModel:
    """A trained value model: `score` trajectories (higher: more likely resolved)."""

    def __init__(self, path: str | Path, max_length: int | None = None):
        """`max_length`: tokens a trajectory is cut to (default: what the model was trained on)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise ConfigError(f"no value model at {path} (train one with `orchard train value`)")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        if self.tokenizer.pad_token is None:  # batches are padded (the model reads each one's last real token)
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(folder)
        self.model.eval()
        trained: Any = getattr(self.model.config, "value_max_length", None)
        self.max_length = max_length or int(trained or 2048)

    def score(self, records: Sequence[TrajectoryRecord]) -> list[float]:
        """The records' scores, from one batch (the model reads each one's last token, not the padding)."""
        import torch

        if not records:
            return []
        ids = [encode(self.tokenizer, trajectory_text(self.tokenizer, r), self.max_length) for r in records]
        batch = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt")
        with torch.no_grad():
            return [float(x) for x in self.model(**batch).logits[:, 0]]


def rerank(
    candidates: dict[str, list[TrajectoryRecord]], model: ValueModel, *, empty_fails: bool = False
) -> dict[str, Any]:
    """For each task's candidates: the one-sample rate, the value model's pick, and the oracle pass@n;
    with `empty_fails`, the pick is among the candidates that submitted something (all of them when
    none did), and `non_empty` is the one-sample rate among those."""
    single = picked = oracle = kept = 0.0
    picks: dict[str, str] = {}
    for instance_id, records in candidates.items():
        shortlist = [r for r in records if r.patch.strip()] if empty_fails else records
        shortlist = shortlist or records
        scores = model.score(shortlist)
        best = shortlist[max(range(len(shortlist)), key=lambda i: scores[i])]
        picks[instance_id] = best.id
        single += sum(bool(r.resolved) for r in records) / len(records)
        kept += sum(bool(r.resolved) for r in shortlist) / len(shortlist)
        picked += bool(best.resolved)
        oracle += any(r.resolved for r in records)
    n = max(1, len(candidates))
    figures = {"tasks": len(candidates), "one_sample": single / n, "reranked": picked / n}
    return figures | ({"non_empty": kept / n} if empty_fails else {}) | {"oracle_pass_at_n": oracle / n, "picks": picks}


def rerank_run(
    run_id: str, value_model: str | Path, *, empty_fails: bool = False, store: Store | None = None
) -> dict[str, Any]:
    """Per harness of an evaluation run: `rerank` of each task's graded samples."""
    with session(store) as db:
        query = select(TrajectoryRecord).where(
            TrajectoryRecord.run_id == run_id, col(TrajectoryRecord.resolved).is_not(None)
        )
        records = list(db.exec(query))
    model = ValueModel(value_model)
    by_harness: dict[str, dict[str, list[TrajectoryRecord]]] = {}
    for record in records:
        by_harness.setdefault(record.harness, {}).setdefault(record.instance_id, []).append(record)
    return {
        harness: {k: v for k, v in rerank(tasks, model, empty_fails=empty_fails).items() if k != "picks"}
        for harness, tasks in by_harness.items()
    }

"""The value model: a scalar head that reads a trajectory and predicts whether it resolved its task.

Trained on stored rollouts of any past runs (trajectories are persistent assets; the label is the
grader's verdict), with transformers' `Trainer` on `AutoModelForSequenceClassification`
(`num_labels=1`, a regression on 0/1). A trajectory is shown as its chat rendering, cut from the
left to `max_length` so the end (the final state, the last observations) is always kept; the
final submission is appended, since that is what gets graded. Scoring with a trained one (and
reranking, `orchard eval --k n --rerank PATH`) is evaluation's: `orchard.eval.rerank`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from orchard.agents.checkpoint import model_folder
from orchard.errors import ConfigError
from orchard.eval.rerank import encode, trajectory_text
from orchard.store import Store, TrajectoryRecord, session
from orchard.train import quiet, save_trained, shared_args
from orchard.train.config import ValueConfig


def graded_trajectories(runs: Sequence[str] | None = None, *, store: Store | None = None) -> list[TrajectoryRecord]:
    with session(store) as db:
        query = select(TrajectoryRecord).where(col(TrajectoryRecord.resolved).is_not(None))
        if runs:
            query = query.where(col(TrajectoryRecord.run_id).in_(list(runs)))
        return list(db.exec(query.order_by(col(TrajectoryRecord.created_at))))


def text_backbone(vlm_folder: str | Path, out: str | Path) -> Path:
    """A Qwen2 sequence classifier holding the language model of a Qwen2-VL-style model (its
    weights, its tokenizer): the base of a value model for a vision-language student, which scores
    trajectories as text (each screenshot a placeholder token). Written once to `out`."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    out = Path(out)
    if (out / "config.json").is_file():
        return out
    vlm = AutoModelForImageTextToText.from_pretrained(str(vlm_folder))
    language = getattr(getattr(vlm, "model", None), "language_model", None)
    text = getattr(vlm.config, "text_config", None)
    if language is None or text is None:
        raise ConfigError(f"{vlm_folder} is no Qwen2-VL-style model: give the value stage a text model (value.base)")
    fields = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"]
    fields += ["num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "pad_token_id"]
    config = Qwen2Config(**{name: getattr(text, name) for name in fields})
    config.num_labels = 1
    model = Qwen2ForSequenceClassification(config)
    missing, unexpected = model.model.load_state_dict(language.state_dict(), strict=False)
    if unexpected or any(not name.startswith("rotary") for name in missing):
        raise ConfigError(
            f"the language model of {vlm_folder} does not fit a Qwen2 model: {(missing + unexpected)[:3]}"
        )
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(vlm_folder)).save_pretrained(out)
    return out


def balanced(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with the rarer label's repeated (in order, round after round) up to the other's count:
    a teacher's trajectories all resolve, so the head would otherwise learn the base rate, not what
    tells a failure from a success."""
    wins = [row for row in rows if row["labels"]]
    losses = [row for row in rows if not row["labels"]]
    few, many = sorted((wins, losses), key=len)
    if not few:
        return rows
    return many + [few[i % len(few)] for i in range(len(many))]


def train_value(
    base_model: str | Path,
    trajectories: Sequence[TrajectoryRecord],
    output_dir: str | Path,
    config: ValueConfig | None = None,
    callbacks: list | None = None,
) -> dict[str, Any]:
    """Fit a scalar head on `trajectories` (resolved: 1, not: 0), the Trainer's arguments taken from
    `config`; the model goes to `output_dir`. `base_model`: a folder, hub id or GGUF file (its
    converted folder, `orchard.agents.checkpoint`)."""
    from datasets import Dataset
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    config = config or ValueConfig()
    labels = {bool(t.resolved) for t in trajectories}
    if len(labels) < 2:
        raise ConfigError(
            f"a value model needs resolved and unresolved trajectories; these {len(trajectories)} are all "
            f"{'resolved' if labels == {True} else 'unresolved'}"
        )
    base_model = model_folder(base_model)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(base_model, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.value_max_length = config.max_length  # saved with it: scoring reads trajectories the same way
    rows = balanced(
        [
            {
                "input_ids": encode(tokenizer, trajectory_text(tokenizer, t), config.max_length),
                "labels": float(bool(t.resolved)),
            }
            for t in trajectories
        ]
    )
    args = TrainingArguments(
        output_dir=str(output_dir),
        learning_rate=config.learning_rate,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        seed=config.seed,
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
        "trajectories": len(trajectories),
        "examples": len(rows),
        "resolved": sum(bool(t.resolved) for t in trajectories),
        "steps": trainer.state.global_step,
        "train_loss": result.training_loss,
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "seconds": time.monotonic() - started,
        "output_dir": str(output_dir),
    }

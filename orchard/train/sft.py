"""Credit-assignment SFT: per-token labels built from the chat template, trained with TRL.

Resolved trajectories train on every assistant turn; unresolved ones only on the assistant turns
inside rise segments (steps whose credit is >= epsilon), with the whole earlier history kept as
context. System, user and tool messages (the task and every observation) never carry loss.

Labels are built here, not by TRL: the conversation is rendered with the model's chat template
(tools included), and each assistant turn's characters are located by rendering the conversation
up to it, with and without it; tokens whose characters fall in a trained turn keep their id as
label, all others get -100. TRL's `SFTTrainer` then receives `input_ids` and `labels` as they are.
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
from orchard.store import StepRecord, Store, TrajectoryRecord, session
from orchard.train import lora_config, quiet, save_trained, shared_args
from orchard.train.config import SFTConfig
from orchard.train.credit import EPSILON

IGNORE = -100


def assistant_spans(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant turn in it."""
    render = lambda part, gen: tokenizer.apply_chat_template(  # noqa: E731
        part, tools=tools or None, tokenize=False, add_generation_prompt=gen
    )
    full = render(messages, False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, after = render(messages[:index], True), render(messages[: index + 1], False)
        if not (after.startswith(before) and full.startswith(after)):
            raise ConfigError(
                "the chat template does not render a conversation prefix by prefix, so assistant turns "
                "cannot be located; use a template like ChatML (Qwen, SmolLM, the tiny model)"
            )
        spans.append((len(before), len(after)))
    return full, spans


def token_labels(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict] | None,
    trained_turns: set[int] | None = None,
    max_length: int | None = None,
) -> dict[str, list[int]] | None:
    """`input_ids` and `labels` for one conversation; only assistant turns in `trained_turns`
    (indices among assistant turns; None: all of them) are labelled. None if nothing is trained."""
    text, spans = assistant_spans(tokenizer, messages, tools)
    chosen = [span for turn, span in enumerate(spans) if trained_turns is None or turn in trained_turns]
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    labels = [
        token if any(start <= begin and end <= stop for start, stop in chosen) and end > begin else IGNORE
        for token, (begin, end) in zip(input_ids, offsets, strict=True)
    ]
    if max_length is not None:
        input_ids, labels = input_ids[:max_length], labels[:max_length]
    if all(label == IGNORE for label in labels):
        return None
    return {"input_ids": list(input_ids), "labels": labels}


@dataclass
class SFTFilters:
    """Which collected trajectories may train (as options of collection in the paper)."""

    max_tokens: int | None = None
    """Leave out trajectories that used more tokens than this (prompt + completion, all steps)."""
    drop_unparsable: bool = True
    """Leave out trajectories with a reply the harness could not parse (a format error)."""
    drop_undefined_tools: bool = True
    """Leave out trajectories that called a tool their harness did not offer."""

    def keeps(self, trajectory: TrajectoryRecord, steps: Sequence[StepRecord]) -> bool:
        if self.max_tokens is not None and trajectory.prompt_tokens + trajectory.completion_tokens > self.max_tokens:
            return False
        if self.drop_unparsable and (trajectory.format_errors or any(s.format_error for s in steps)):
            return False
        if self.drop_undefined_tools:
            offered = {t["function"]["name"] for t in json.loads(trajectory.tools) or []}
            if offered:
                for message in json.loads(trajectory.messages):
                    for call in message.get("tool_calls") or []:
                        if call.get("function", {}).get("name") not in offered:
                            return False
        return True


@dataclass
class SFTExample:
    trajectory_id: str
    harness: str
    resolved: bool
    trained_turns: int
    input_ids: list[int]
    labels: list[int]

    def row(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids, "labels": self.labels, "harness": self.harness}


def trained_trajectories(
    *,
    runs: Sequence[str] | None = None,
    harnesses: Sequence[str] | None = None,
    epsilon: float = EPSILON,
    filters: SFTFilters | None = None,
    store: Store | None = None,
    ungraded_runs: Sequence[str] = (),
) -> list[tuple[TrajectoryRecord, set[int] | None]]:
    """The stored trajectories that train (of `runs` and `ungraded_runs`, or all when neither is
    given), each with the assistant turns that do: None for all (resolved), its rise-segment turns
    for an unresolved one (credit assignment must have run on it; without credits it is left out).
    `filters` leave out trajectories, never delete them: collection keeps everything.

    Trajectories no grader saw (`resolved` None) are left out, except those of `ungraded_runs`: they
    train whole, as if resolved (the conversations an `orchard proxy` run recorded, whose harness is
    trusted to have done its task)."""
    filters = filters or SFTFilters()
    trusted = set(ungraded_runs)
    with session(store) as db:
        query = select(TrajectoryRecord).order_by(col(TrajectoryRecord.created_at))
        if runs or trusted:
            query = query.where(col(TrajectoryRecord.run_id).in_([*(runs or []), *trusted]))
        if harnesses:
            query = query.where(col(TrajectoryRecord.harness).in_(list(harnesses)))
        trajectories = list(db.exec(query))
        steps = {
            t.id: list(
                db.exec(select(StepRecord).where(StepRecord.trajectory_id == t.id).order_by(col(StepRecord.index)))
            )
            for t in trajectories
        }
    chosen: list[tuple[TrajectoryRecord, set[int] | None]] = []
    for trajectory in trajectories:
        ungraded = trajectory.resolved is None
        if (ungraded and trajectory.run_id not in trusted) or not filters.keeps(trajectory, steps[trajectory.id]):
            continue
        if trajectory.resolved or ungraded:
            chosen.append((trajectory, None))
            continue
        turns = {s.index for s in steps[trajectory.id] if s.credit is not None and s.credit >= epsilon}
        if turns:
            chosen.append((trajectory, turns))
    return chosen


def sft_examples(
    tokenizer: Any,
    *,
    runs: Sequence[str] | None = None,
    harnesses: Sequence[str] | None = None,
    epsilon: float = EPSILON,
    max_length: int | None = 4096,
    filters: SFTFilters | None = None,
    store: Store | None = None,
    ungraded_runs: Sequence[str] = (),
) -> list[SFTExample]:
    """Training examples from stored trajectories (`trained_trajectories`): resolved whole,
    unresolved by their rise segments."""
    examples = []
    for trajectory, turns in trained_trajectories(
        runs=runs, harnesses=harnesses, epsilon=epsilon, filters=filters, store=store, ungraded_runs=ungraded_runs
    ):
        messages = json.loads(trajectory.messages)
        built = token_labels(tokenizer, messages, json.loads(trajectory.tools), turns, max_length)
        if built is None:
            continue
        count = len([m for m in messages if m["role"] == "assistant"]) if turns is None else len(turns)
        examples.append(
            SFTExample(
                trajectory.id, trajectory.harness, bool(trajectory.resolved), count, built["input_ids"], built["labels"]
            )
        )
    return examples


def trl_arguments(config: SFTConfig, output_dir: str | Path, **extra: Any) -> Any:
    """TRL's `SFTConfig` for a run of `config` on examples labelled here (TRL prepares nothing)."""
    from trl import SFTConfig as TRLArguments

    return TRLArguments(
        output_dir=str(output_dir),
        learning_rate=config.learning_rate,
        max_steps=config.max_steps,
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation,
        max_length=config.max_length,
        seed=config.seed,
        bf16=config.bf16,
        gradient_checkpointing=config.gradient_checkpointing,  # TRL's default is on: always say which
        **shared_args(),
        dataset_kwargs={"skip_prepare_dataset": True},
        remove_unused_columns=False,
        **extra,
    )


def sft_trainer() -> type:
    """TRL's `SFTTrainer`, on a CPU with transformers' loss: the model's own cross-entropy over the
    labels, the same number. TRL's chunked fused LM head spares a GPU the full logits (and yields
    entropy and token-accuracy metrics), but makes a step about 1.2x as slow on a CPU
    (bench/sft_step.py)."""
    import torch
    from transformers import Trainer
    from trl import SFTTrainer

    if torch.cuda.is_available():
        return SFTTrainer

    class CPUSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    return CPUSFTTrainer


def train_sft(
    model_path: str | Path,
    examples: Sequence[SFTExample],
    output_dir: str | Path,
    config: SFTConfig | None = None,
    callbacks: list | None = None,
) -> dict[str, Any]:
    """One TRL SFT run on pre-tokenized examples, TRL's arguments taken from `config`; the model is
    saved to `output_dir`."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not examples:
        raise ConfigError("no SFT examples: collect trajectories and run credit assignment first")
    config = config or SFTConfig()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    peft_config = lora_config(config.lora_rank) if config.lora else None
    args = trl_arguments(config, output_dir)
    dataset = Dataset.from_list([{"input_ids": e.input_ids, "labels": e.labels} for e in examples])
    trainer = sft_trainer()(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    started = time.monotonic()
    result = quiet(trainer).train()
    save_trained(trainer, output_dir)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {
        "examples": len(examples),
        "steps": trainer.state.global_step,
        "processes": trainer.accelerator.num_processes,
        "gradient_checkpointing": trainer.args.gradient_checkpointing,
        "train_loss": result.training_loss,
        "losses": losses,
        "seconds": time.monotonic() - started,
        "output_dir": str(output_dir),
    }

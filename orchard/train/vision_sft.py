"""SFT of a vision-language model on trajectories with screenshots, trained with TRL's SFTTrainer.

Labels are built as for text (`orchard.train.sft.token_labels`: the chat template's assistant
turns carry loss, the task and every observation do not); each image's tokens are -100 too.

A turn learns from what the model saw at that turn. A harness keeps only its newest `keep_images`
screenshots in the model's context (`orchard.agents.loop.in_context`), so a later screenshot
pushes an earlier one out: one rendering of the whole trajectory would show early turns a
placeholder where they had a page. A trajectory therefore gives one example per run of trained
turns that saw the same screenshots: the conversation up to the run's last turn, with the images
that turn had in context (with every screenshot kept, or none pushed out, one example). A cut at
`max_length` never splits an image: it falls before the image, which is left out.

Batches: TRL's `DataCollatorForLanguageModeling` pads ids and labels; `ScreenshotCollator` adds the
batch's screenshots (PNG, decoded per batch, so examples hold kilobytes, not decoded pixels) as
`pixel_values` and `image_grid_thw`, and `mm_token_type_ids` (Qwen-VL's multimodal RoPE needs
it). TRL's `DataCollatorForVisionLanguageModeling` does not fit: it renders conversations itself
and trains all assistant turns, where credit assignment trains chosen ones; and it needs a
transformers processor, which transformers 5.24 cannot build for Qwen-VL without torchvision.
The screenshots' column is `screenshots`, not `images`, which SFTTrainer takes for that path.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.agents.base import Message
from orchard.agents.loop import in_context
from orchard.agents.vision import (
    IMAGE_PAD,
    image_tokens,
    load_processor,
    message_pngs,
    model_inputs,
    png_image,
)
from orchard.errors import ConfigError
from orchard.train import lora_config, quiet, save_trained
from orchard.train.config import SFTConfig
from orchard.train.sft import IGNORE, token_labels, trl_arguments

VISION_START = "<|vision_start|>"


def vision_examples(
    processor: Any,
    messages: list[Message],
    tools: list[dict] | None,
    trained_turns: set[int] | None = None,
    max_length: int | None = None,
    *,
    keep_images: int | None,
) -> list[dict[str, Any]]:
    """Training examples of one conversation (images inline: `load_images` restores stored ones):
    each `{"input_ids", "labels", "screenshots"}` (PNG bytes, in order). Only assistant turns in
    `trained_turns` (indices among assistant turns; None: all) carry loss. `keep_images` is what
    the model kept in context: the harness's `keep_images`, or the model's `max_images` where that
    is fewer. A ConfigError names an image that cannot be taken (no inline PNG, over the bounds)."""
    assistant = [index for index, message in enumerate(messages) if message.get("role") == "assistant"]
    runs: list[tuple[int, list[int]]] = []  # (screenshots pushed out of context, turns)
    for turn in range(len(assistant)):
        if trained_turns is not None and turn not in trained_turns:
            continue
        shown = _image_parts(messages[: assistant[turn]])
        pushed_out = 0 if keep_images is None else max(0, shown - keep_images)
        if runs and runs[-1][0] == pushed_out:
            runs[-1][1].append(turn)
        else:
            runs.append((pushed_out, [turn]))
    examples = []
    for _, turns in runs:
        context = in_context(messages[: assistant[turns[-1]] + 1], keep_images)
        example = _example(processor, context, tools, set(turns), max_length)
        if example is not None:
            examples.append(example)
    return examples


def _image_parts(messages: list[Message]) -> int:
    """How many image parts a conversation has (counted, not decoded)."""
    return sum(
        1
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") == "image_url"
    )


def _example(
    processor: Any, messages: list[Message], tools: list[dict] | None, turns: set[int], max_length: int | None
) -> dict[str, Any] | None:
    """One conversation as ids, labels and screenshots; None when no trained token is left."""
    built = token_labels(processor.tokenizer, messages, tools, turns)
    if built is None:
        return None
    try:
        screenshots = message_pngs(messages)
        counts = image_tokens(processor, [png_image(data) for data in screenshots])
    except ValueError as exc:
        raise ConfigError(f"a trajectory's screenshot cannot train: {exc}") from None
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    if sum(1 for token in built["input_ids"] if token == pad) != len(counts):
        raise ConfigError("the chat template does not render each image part as one <|image_pad|>")
    ids: list[int] = []
    labels: list[int] = []
    images: Iterator[int] = iter(counts)
    for token, label in zip(built["input_ids"], built["labels"], strict=True):
        repeat = next(images) if token == pad else 1
        ids += [token] * repeat
        labels += [IGNORE if token == pad else label] * repeat
    if max_length is not None and len(ids) > max_length:
        ids, labels, screenshots = _cut(processor, ids, labels, screenshots, max_length)
    if all(label == IGNORE for label in labels):
        return None
    return {"input_ids": ids, "labels": labels, "screenshots": screenshots}


def _cut(
    processor: Any, ids: list[int], labels: list[int], screenshots: list[bytes], max_length: int
) -> tuple[list[int], list[int], list[bytes]]:
    """The first `max_length` tokens, or fewer: a cut inside an image moves before its start token."""
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    start = processor.tokenizer.convert_tokens_to_ids(VISION_START)
    cut, whole = max_length, 0
    index = 0
    while index < len(ids) and index < cut:
        if ids[index] != pad:
            index += 1
            continue
        end = index
        while end < len(ids) and ids[end] == pad:
            end += 1
        if end > cut:  # this image would be split
            cut = index - 1 if index > 0 and ids[index - 1] == start else index
            break
        whole, index = whole + 1, end
    return ids[:cut], labels[:cut], screenshots[:whole]


@dataclass
class ScreenshotCollator:
    """A batch of `vision_examples`: TRL's padding of ids and labels, and the screenshots as the
    model's `pixel_values`, `image_grid_thw` and `mm_token_type_ids`."""

    processor: Any
    text: Any = field(init=False)

    def __post_init__(self) -> None:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        self.text = DataCollatorForLanguageModeling(pad_token_id=self.processor.tokenizer.pad_token_id)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.text([{"input_ids": row["input_ids"], "labels": row["labels"]} for row in rows])
        images = [png_image(data) for row in rows for data in row["screenshots"]]
        return {**batch, **model_inputs(self.processor, batch["input_ids"].tolist(), images)}


def train_vision_sft(
    model_path: str | Path,
    examples: Sequence[dict[str, Any]],
    output_dir: str | Path,
    config: SFTConfig | None = None,
    callbacks: list | None = None,
) -> dict[str, Any]:
    """One TRL SFT run of a vision-language model on `vision_examples`, TRL's arguments taken from
    `config` (as `train_sft`); the model, its tokenizer and image processor are saved to `output_dir`."""
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText
    from trl import SFTTrainer

    if not examples:
        raise ConfigError("no SFT examples: collect trajectories with screenshots and run credit assignment first")
    config = config or SFTConfig()
    processor = load_processor(model_path)
    model = AutoModelForImageTextToText.from_pretrained(str(model_path))
    peft_config = lora_config(config.lora_rank) if config.lora else None
    # a batch without screenshots leaves the vision tower without gradients (as TRL sets for VLMs)
    args = trl_arguments(config, output_dir, ddp_find_unused_parameters=True)
    rows = [{key: example[key] for key in ("input_ids", "labels", "screenshots")} for example in examples]
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=processor.tokenizer,
        data_collator=ScreenshotCollator(processor),
        peft_config=peft_config,
        callbacks=callbacks,
    )
    started = time.monotonic()
    result = quiet(trainer).train()
    save_trained(trainer, output_dir)
    if trainer.accelerator.is_main_process:
        processor.image_processor.save_pretrained(str(output_dir))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {
        "examples": len(examples),
        "screenshots": sum(len(example["screenshots"]) for example in examples),
        "steps": trainer.state.global_step,
        "processes": trainer.accelerator.num_processes,
        "gradient_checkpointing": trainer.args.gradient_checkpointing,
        "train_loss": result.training_loss,
        "losses": losses,
        "seconds": time.monotonic() - started,
        "output_dir": str(output_dir),
    }

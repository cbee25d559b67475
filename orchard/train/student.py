"""The student: the model a recipe trains, a text model or a vision-language one.

The pipeline (`orchard.train.pipeline`) and RL (`orchard.train.rl`) ask the student what differs
between the two and never ask which one it is: how it is built offline, how it learns from
trajectories (SFT), which class loads it for a trainer, what a checkpoint must carry besides the
weights, and the base of its value model.

`student_at(path)` tells them apart by the folder (`orchard.agents.vision.holds_image_processor`);
`build_student` makes one from the recipe's `student` config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchard.store import Store
    from orchard.train.config import SFTConfig, StudentConfig
    from orchard.train.sft import SFTFilters

Log = Callable[[str], None]


@dataclass(frozen=True)
class TextStudent:
    """A causal language model and its tokenizer."""

    path: str

    def auto_class(self) -> Any:
        """The transformers class a trainer loads it with."""
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def check_rl_harnesses(self, harnesses: Sequence[str]) -> None:
        """A ConfigError when RL cannot roll out under one of `harnesses`; any harness suits text."""

    def save_beside(self, output_dir: str) -> None:
        """What a checkpoint of it needs besides what the trainer saved: nothing for text."""

    def value_base(self, work: Path) -> str:
        """The model a value model of it starts from: itself."""
        return self.path

    def sft(
        self,
        config: SFTConfig,
        output_dir: Path,
        runs: list[str],
        *,
        epsilon: float,
        filters: SFTFilters,
        callbacks: list[Any],
        store: Store | None,
    ) -> dict[str, Any]:
        """SFT on the trajectories of `runs`: resolved ones whole, unresolved ones by their rise
        segments; the trainer's summary with the examples counted (by harness, resolved, partial)."""
        from collections import Counter

        from transformers import AutoTokenizer

        from orchard.train.sft import sft_examples, train_sft

        examples = sft_examples(
            AutoTokenizer.from_pretrained(self.path),
            runs=runs,
            epsilon=epsilon,
            max_length=config.max_length,
            filters=filters,
            store=store,
            ungraded_runs=config.proxy_runs,
        )
        result = train_sft(self.path, examples, output_dir, config, callbacks=callbacks)
        result["by_harness"] = dict(Counter(e.harness for e in examples))
        result["resolved_examples"] = sum(e.resolved for e in examples)
        result["partial_examples"] = sum(not e.resolved for e in examples)
        return result


@dataclass(frozen=True)
class VisionStudent(TextStudent):
    """A Qwen2-VL-style model: its tokenizer and its image processor, and screenshots in its turns."""

    def auto_class(self) -> Any:
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText

    def check_rl_harnesses(self, harnesses: Sequence[str]) -> None:
        """RL's rollouts carry text only (the policy's log-probabilities are taken from text), so
        not a harness that shows screenshots."""
        from orchard.agents import harness_factory
        from orchard.errors import ConfigError

        shown = [h for h in harnesses if getattr(harness_factory(h)(), "keep_images", None) is not None]
        if shown:
            raise ConfigError(
                f"rl.harnesses {', '.join(shown)} show screenshots, which RL rollouts cannot carry yet "
                "(the policy's log-probabilities are taken from text): use a text harness such as bid"
            )

    def save_beside(self, output_dir: str) -> None:
        """Its image processor, so the checkpoint stays a vision-language model."""
        from orchard.agents.vision import load_processor

        load_processor(self.path).image_processor.save_pretrained(output_dir)

    def value_base(self, work: Path) -> str:
        """Its language model as a sequence classifier (`orchard.train.value.text_backbone`): a
        value model scores trajectories as text."""
        from orchard.train.value import text_backbone

        return str(text_backbone(self.path, work / "value-base"))

    def sft(
        self,
        config: SFTConfig,
        output_dir: Path,
        runs: list[str],
        *,
        epsilon: float,
        filters: SFTFilters,
        callbacks: list[Any],
        store: Store | None,
    ) -> dict[str, Any]:
        """The same trajectories and turns as a text student's, their screenshots in the batch as
        the model saw them (only the newest its harness kept in context)."""
        import json
        from collections import Counter

        from orchard.agents import harness_factory
        from orchard.agents.loop import load_images
        from orchard.agents.vision import load_processor
        from orchard.train.sft import trained_trajectories
        from orchard.train.vision_sft import train_vision_sft, vision_examples

        processor = load_processor(self.path)
        examples: list[dict[str, Any]] = []
        harnesses: Counter[str] = Counter()
        resolved = 0
        for trajectory, turns in trained_trajectories(
            runs=runs, epsilon=epsilon, filters=filters, store=store, ungraded_runs=config.proxy_runs
        ):
            keep = getattr(harness_factory(trajectory.harness)(), "keep_images", None)
            made = vision_examples(
                processor,
                load_images(json.loads(trajectory.messages)),
                json.loads(trajectory.tools),
                turns,
                config.max_length,
                keep_images=keep,
            )
            examples += made
            harnesses[trajectory.harness] += len(made)
            resolved += len(made) if trajectory.resolved else 0
        result = train_vision_sft(self.path, examples, output_dir, config, callbacks=callbacks)
        result["by_harness"] = dict(harnesses)
        result["resolved_examples"] = resolved
        result["partial_examples"] = len(examples) - resolved
        return result


Student = TextStudent | VisionStudent


def student_at(path: str | Path) -> Student:
    """The student in folder (or hub id, or GGUF file: its converted folder) `path`: a
    vision-language one where it holds an image processor."""
    from orchard.agents.checkpoint import model_folder
    from orchard.agents.vision import holds_image_processor

    folder = model_folder(path)
    return (VisionStudent if holds_image_processor(folder) else TextStudent)(folder)


def build_student(config: StudentConfig, work: Path, log: Log, *, vision: bool) -> Student:
    """The student the recipe's `student` config names: its `path` (a GGUF file converted once,
    `orchard.agents.checkpoint`); else SmolLM2-135M-Instruct, converted offline into Orchard's
    cache the first time (`smollm2`); else a tiny model built offline from a config, once in
    `work`, a vision-language one when `vision` (the config's `vision`, or the tasks' kind's)."""
    if config.path:
        return student_at(config.path)
    if config.smollm2:
        from orchard.train.smollm import default_folder, smollm2_folder

        if not (default_folder() / "config.json").is_file():
            log(f"[setup] converting SmolLM2-135M-Instruct into {default_folder()}")
        return TextStudent(str(smollm2_folder()))
    folder = work / ("student-base-vl" if vision else "student-base")
    if not (folder / "config.json").is_file():
        from orchard.train.tiny import build_tiny_model
        from orchard.train.tiny_vlm import build_tiny_vlm

        log(f"[setup] building a tiny {'vision-language ' if vision else ''}student offline in {folder}")
        build = build_tiny_vlm if vision else build_tiny_model
        build(folder, hidden_size=config.tiny_hidden_size, layers=config.tiny_layers)
    return (VisionStudent if vision else TextStudent)(str(folder))

"""Configs of `orchard eval` and `orchard collect`: their flags as keys of a YAML file.

`load_config_file(path, EvalConfig)` (from `orchard.configfile`) reads one, its paths taken from
the file's folder; the CLI builds the same model from its flags, whose comma-separated lists
(`--harness bash,tools`) are accepted as they are. A key means what its flag means:

    tasks: ../tasks/tasks.jsonl
    models: [scripted:gold, openai:my-model]
    base_url: http://localhost:8000/v1
    harnesses: [bash, tools, cli]
    k: 4
    rerank: ../runs/value
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, model_validator

from orchard.agents.loop import EPISODE_STEPS
from orchard.configfile import ConfigModel, Folder, HarnessSpec, LocalPath, ModelSpec, Source, local_path

if TYPE_CHECKING:
    from orchard.tasks.base import TaskBase


def _split(value: Any) -> Any:
    """A flag's comma-separated list, or a YAML list as it is."""
    return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value


def _predictions(value: str, info: ValidationInfo) -> str:
    return value if value == "gold" else local_path(value, info)


Predictions = Annotated[str, AfterValidator(_predictions)]
"""A predictions file, or the word gold (the tasks' own patches)."""
Names = Annotated[list[str], BeforeValidator(_split), Field(min_length=1)]
ModelSpecs = Annotated[list[ModelSpec], BeforeValidator(_split), Field(min_length=1)]
HarnessSpecs = Annotated[list[HarnessSpec], BeforeValidator(_split), Field(min_length=1)]


class ModelOptions(ConfigModel):
    """How the models are asked: their server, their replies' length and sampling."""

    base_url: str | None = Field(default=None, description="OpenAI-compatible server of openai:NAME models")
    max_tokens: int | None = Field(
        default=None, ge=1, description="tokens per model reply (default: the adapter's, openai 2048, hf 256)"
    )
    temperature: float | None = Field(default=None, ge=0, description="sampling temperature (default: 0, greedy)")
    request_timeout: float | None = Field(
        default=None, gt=0, description="seconds one request to a model server may take, retried twice (default: 120)"
    )


class Attempts(ModelOptions):
    """Models working tasks under harnesses: what `orchard eval`, `orchard collect` and a recipe's
    collect and eval stages share (`orchard.eval.jobs` runs them all)."""

    renamed = {"max_steps": "episode_steps"}

    harnesses: HarnessSpecs | None = Field(
        default=None, description="harnesses: bash, tools, cli or FILE.py:Class (none: the task kind's own)"
    )
    episode_steps: int = Field(default=EPISODE_STEPS, ge=1, description="turns per episode")

    def harnesses_for(self, tasks: Sequence[TaskBase]) -> list[str]:
        """The harnesses named, or those the kind of `tasks` is worked through when none are."""
        return list(self.harnesses) if self.harnesses else list(type(tasks[0]).harnesses)


class _TaskSet(Attempts):
    """Attempts on a task set named by its source: `orchard eval` and `orchard collect`."""

    tasks: Source = Field(description="task set: a JSON or JSONL file, a dataset folder or a hub id")
    split: str = Field(default="test", min_length=1, description="split of a dataset")
    ids: Names | None = Field(default=None, description="only these task ids")
    repos: Folder | None = Field(
        default=None, description="local mirror of the repositories (DIR/owner/name or DIR/owner__name)"
    )
    image_source: Literal["build", "swebench"] = Field(
        default="build", description="task images: build them offline, or use SWE-bench's published ones"
    )
    k: int = Field(default=1, ge=1, description="samples per task and harness")
    concurrency: int = Field(default=2, ge=1, description="attempts at once")
    rerun: bool = Field(
        default=False, description="start the run afresh: forget what an earlier run of the same evaluation recorded"
    )


class EvalConfig(_TaskSet):
    """`orchard eval`: models under harnesses, or predictions graded; stored and reported."""

    models: ModelSpecs | None = Field(
        default=None,
        description="model specs: scripted:gold, scripted:regress, scripted:sed, scripted:FILE, noop, openai:NAME, hf:PATH, llama:PATH or module:Class[:ARG]",
    )
    predictions: Predictions | None = Field(
        default=None,
        description="grade these patches instead: a JSONL file of instance_id, model_patch; gold: the tasks' own",
    )
    report: LocalPath | None = Field(default=None, description="also write SWE-bench's report JSON to this file")
    rerank: LocalPath | None = Field(
        default=None, description="a value model folder: submit its pick among the k samples of each task"
    )

    @model_validator(mode="after")
    def _one_subject(self) -> EvalConfig:
        if (self.models is None) == (self.predictions is None):
            raise ValueError("say what to evaluate: models (agents), or predictions (a JSONL file, or gold)")
        if self.rerank is not None and not (Path(self.rerank) / "config.json").is_file():
            raise ValueError(f"rerank: no value model at {self.rerank} (train one with `orchard train value`)")
        return self


class CollectRunConfig(_TaskSet):
    """`orchard collect`: teachers roll over a task set; every trajectory is kept, graded, as a collect run."""

    models: ModelSpecs = Field(description="the teachers' model specs: scripted:gold, openai:NAME, hf:PATH, ...")

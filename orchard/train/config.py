"""The training configs: one per stage, each taken as it is by the function that runs the stage.

`SFTConfig` by `train_sft`, `RLConfig` by `train_rl`, `ValueConfig` by `train_value`; `RecipeConfig`,
the recipe of `orchard train RECIPE --config FILE`, is made of them and of `StudentConfig`,
`CollectConfig`, `CreditConfig` and `EvalStageConfig`. The YAML file, the CLI and code build the
same models, so each setting has one name, one default and one description (the field's).

Vocabulary: `max_steps` is always training steps (optimizer updates; in a stage with `epochs`,
-1 trains for them); `episode_steps` is always the turns an agent gets in one episode.

Defaults are a starting point for a real run (a 7-8B student on GPUs, as
`examples/configs/swe-qwen3.yaml`); hardware switches (`bf16`, `gradient_checkpointing`, `lora`,
`use_vllm`) are off, so a default works on any machine. `examples/configs/swe-tiny.yaml` and the
tests set small values explicitly.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from orchard.agents.loop import EPISODE_STEPS
from orchard.configfile import ConfigModel, Folder, HarnessSpec, LocalPath, ModelSpec, Source
from orchard.eval.config import Attempts
from orchard.train.bar import BARConfig
from orchard.train.credit import EPSILON


def _trains(steps: int) -> int:
    if steps == 0:
        raise ValueError("0 trains nothing: give a step count, or -1 to train for `epochs`")
    return steps


TrainingSteps = Annotated[int, Field(ge=-1), AfterValidator(_trains)]
"""`max_steps`: optimizer steps, or -1 for as many as the epochs take."""


class _Training(ConfigModel):
    """What every trainer takes (TRL's and transformers' arguments of the same name)."""

    learning_rate: float = Field(default=1e-5, gt=0, description="peak learning rate (linear decay)")
    seed: int = Field(default=0, description="seed of the trainer (new weights, data order, sampling)")


class _Accelerated(_Training):
    """Hardware switches of the policy trainers, off by default."""

    bf16: bool = Field(default=False, description="bf16 mixed precision (GPUs since Ampere; CPUs run it slowly)")
    gradient_checkpointing: bool = Field(
        default=False, description="recompute activations in the backward pass: less memory, about 30% slower"
    )
    lora: bool = Field(
        default=False, description="train LoRA adapters (peft, the `lora` extra), merged into the saved model"
    )
    lora_rank: int = Field(default=16, ge=1, description="rank of the LoRA adapters (alpha is twice the rank)")


class StudentConfig(ConfigModel):
    """The model that the recipe trains."""

    path: Source | None = Field(
        default=None,
        description="a model folder, a GGUF file or a hub id; none: `smollm2`, else a tiny model built offline",
    )
    smollm2: bool = Field(
        default=False, description="without a path: SmolLM2-135M-Instruct, a real small model, converted offline"
    )
    tiny_hidden_size: int = Field(default=64, ge=1, description="hidden size of the tiny model built offline")
    tiny_layers: int = Field(default=2, ge=1, description="layers of the tiny model built offline")
    vision: bool | None = Field(
        default=None,
        description="the tiny model sees images (a Qwen2-VL-style model); none: when the tasks' kind shows images",
    )
    serve: Literal["transformers", "llama.cpp"] = Field(
        default="transformers",
        description="where its checkpoints generate in RL rollouts and evaluation: in this process, or on "
        "llama.cpp's server (`llama:`, a text model; several times faster on a CPU; `orchard model llama-server`)",
    )


class CollectConfig(Attempts):
    """Collection: every teacher works every task under every harness, `samples` times; all kept,
    graded (`orchard collect` on the recipe's tasks)."""

    teachers: list[ModelSpec] = Field(
        default=["scripted:gold"],
        min_length=1,
        description="model specs: scripted:gold, scripted:FILE, openai:NAME (with base_url), hf:PATH",
    )
    samples: int = Field(default=1, ge=1, description="episodes per task, teacher and harness")


class CreditConfig(ConfigModel):
    """Credit assignment: per-step values, credits and rise segments of the unresolved trajectories."""

    estimator: Literal["replay", "judge"] = Field(
        default="replay",
        description="replay: the share of FAIL_TO_PASS tests passing after each step, replayed in a fresh "
        "sandbox; judge: a model's estimate (needs `judge`)",
    )
    judge: ModelSpec | None = Field(default=None, description="model spec of the judge estimator")
    epsilon: float = Field(
        default=EPSILON, ge=0, description="a step whose credit is at least this is in a rise segment"
    )

    @model_validator(mode="after")
    def _judge(self) -> CreditConfig:
        if self.estimator == "judge" and not self.judge:
            raise ValueError("estimator judge needs judge: a model spec")
        return self


class SFTConfig(_Accelerated):
    """Credit-assignment SFT (TRL's SFTTrainer): resolved trajectories whole, unresolved ones by rise segments."""

    max_steps: TrainingSteps = Field(default=-1, description="training steps; -1: as many as `epochs` take")
    epochs: float = Field(default=1.0, gt=0, description="passes over the examples, when max_steps is -1")
    batch_size: int = Field(default=1, ge=1, description="examples per device and step")
    gradient_accumulation: int = Field(default=1, ge=1, description="batches accumulated into one step")
    max_length: int = Field(
        default=32768, ge=1, description="tokens per example; a longer trajectory is cut at its end"
    )
    max_tokens: int | None = Field(
        default=None, ge=1, description="filter: leave out trajectories that used more tokens (all steps)"
    )
    drop_unparsable: bool = Field(
        default=True, description="filter: leave out trajectories with a reply the harness could not parse"
    )
    drop_undefined_tools: bool = Field(
        default=True, description="filter: leave out trajectories calling a tool their harness did not offer"
    )
    proxy_runs: list[str] = Field(
        default_factory=list,
        description="runs `orchard proxy --run NAME` recorded (a black-box harness's conversations): trained whole",
    )


class RLConfig(_Accelerated):
    """GRPO (TRL's GRPOTrainer) on Balanced Adaptive Rollout groups of sandboxed episodes."""

    enabled: bool = Field(default=True, description="run the stage (the recipe's switch)")
    max_steps: int = Field(default=200, ge=1, description="training steps: GRPO updates, each on a batch of BAR groups")
    learning_rate: float = Field(default=1e-6, gt=0, description="peak learning rate (linear decay)")
    group_size: int = Field(default=8, ge=1, description="BAR: rollouts in a task's GRPO group (N)")
    max_rollouts: int = Field(default=16, ge=1, description="BAR: rollouts a task may spend to form a group (N_max)")
    stride: int = Field(default=16, ge=1, description="BAR: rollouts generated at a time before trying to form one (s)")
    rho_min: float = Field(default=0.375, ge=0, le=1, description="BAR: least share of successes in a balanced group")
    rho_max: float = Field(
        default=0.625, ge=0, le=1, description="BAR: greatest share of successes in a balanced group"
    )
    bar_memory: bool = Field(
        default=True,
        description="BAR with memory: each task's pass rate so far sizes its next group; a settled task gets one probe",
    )
    settle_after: int = Field(
        default=8, ge=1, description="BAR with memory: agreeing rollouts, the newest, that settle a task"
    )
    harnesses: list[HarnessSpec] | None = Field(
        default=None, min_length=1, description="harnesses; each rollout draws one (none: the task kind's own)"
    )
    episode_steps: int = Field(default=EPISODE_STEPS, ge=1, description="turns per rollout episode")
    max_new_tokens: int = Field(default=2048, ge=1, description="tokens the policy generates per turn")
    max_completion_length: int = Field(
        default=16384, ge=1, description="tokens of a rollout after its prompt (every later turn), cut beyond"
    )
    temperature: float = Field(default=1.0, ge=0, description="sampling temperature of the rollouts")
    success_reward: float = Field(default=1.0, description="reward of a resolved rollout")
    failure_reward: float = Field(default=-1.0, description="reward of any other rollout")
    judge: ModelSpec | None = Field(default=None, description="model spec of a judge scoring rollouts by a rubric")
    judge_weight: float = Field(
        default=0.0, ge=0, description="alpha in R + alpha J: weight of the judge's rubric score J in [0, 1]"
    )
    beta: float = Field(default=0.0, ge=0, description="KL penalty against the reference model (0: none is kept)")
    use_vllm: bool = Field(
        default=False, description="rollouts generate on a vLLM server that TRL keeps in sync (trl vllm-serve)"
    )
    vllm_server: str = Field(default="http://localhost:8000", description="URL of that server")
    parallel: int = Field(default=4, ge=1, description="rollouts of a stride at once")
    tasks: int | None = Field(default=None, ge=1, description="train on the first N tasks only (none: all)")

    @model_validator(mode="after")
    def _balanced(self) -> RLConfig:
        self.bar  # noqa: B018 - BARConfig refuses an impossible combination
        return self

    @property
    def bar(self) -> BARConfig:
        return BARConfig(self.group_size, self.max_rollouts, self.stride, self.rho_min, self.rho_max)


class ValueConfig(_Training):
    """The value model: a scalar head (transformers' Trainer) on graded trajectories, label: resolved."""

    max_steps: TrainingSteps = Field(default=-1, description="training steps; -1: as many as `epochs` take")
    epochs: float = Field(default=3.0, gt=0, description="passes over the trajectories, when max_steps is -1")
    batch_size: int = Field(default=4, ge=1, description="trajectories per device and step")
    max_length: int = Field(
        default=2048, ge=1, description="tokens per trajectory, cut from the left (the end decides); as scored"
    )


class EvalStageConfig(Attempts):
    """The recipe's last stage: the student before and the policy after, under every eval harness
    (`orchard eval` on its own task set, held out from training, or on the training tasks); a
    harness not trained on is reported as held out."""

    enabled: bool = Field(default=False, description="run the stage")
    tasks: Source | None = Field(
        default=None,
        description="held-out task set, sharing no task id or repository with the training tasks "
        "(none: the training tasks themselves, which proves nothing about tasks never seen)",
    )
    ids: list[str] | None = Field(default=None, description="only these task ids of the held-out set")
    samples: int = Field(
        default=2,
        ge=1,
        description="episodes per task and harness of the last checkpoint; the value model reranks them",
    )
    earlier_samples: int | None = Field(
        default=None, ge=1, description="episodes per task and harness of the checkpoints before it (none: samples)"
    )
    temperature: float | None = Field(
        default=0.7, ge=0, description="sampling temperature: the samples differ, so the value model has a choice"
    )


class RecipeConfig(ConfigModel):
    """A recipe (any of `orchard.recipes`): collect -> credit -> sft -> rl -> value [-> eval]."""

    name: str = Field(min_length=1, description="the recipe's name; its stages are runs NAME-credit, NAME-sft, ...")
    tasks: Source = Field(description="task set: a JSON or JSONL file, a dataset folder or a hub id")
    repos: Folder | None = Field(
        default=None, description="local mirror of the repositories (DIR/owner/name or DIR/owner__name)"
    )
    ids: list[str] | None = Field(default=None, description="only these task ids")
    work_dir: LocalPath = Field(
        default="", description="where models and checkpoints go (default: $ORCHARD_HOME/train/NAME)"
    )
    concurrency: int = Field(default=2, ge=1, description="episodes at once in collection and evaluation")
    student: StudentConfig = Field(default_factory=StudentConfig, description="the model trained")
    collect: CollectConfig = Field(default_factory=CollectConfig, description="stage 1: collection")
    credit: CreditConfig = Field(default_factory=CreditConfig, description="stage 2: credit assignment")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="stage 3: SFT")
    rl: RLConfig = Field(default_factory=RLConfig, description="stage 4: RL with BAR")
    value: ValueConfig = Field(default_factory=ValueConfig, description="stage 5: the value model")
    eval: EvalStageConfig = Field(default_factory=EvalStageConfig, description="stage 6 (optional): evaluation")

    @model_validator(mode="before")
    @classmethod
    def _work_dir(cls, data: Any) -> Any:
        if isinstance(data, dict) and "work_dir" not in data and isinstance(data.get("name"), str):
            return {**data, "work_dir": f"$ORCHARD_HOME/train/{data['name']}"}
        return data

"""RL with Balanced Adaptive Rollout: multi-turn episodes in sandboxes, GRPO advantages, TRL's trainer.

TRL's `GRPOTrainer` does the optimisation; Orchard plugs in through `rollout_func`. For each task
in a batch, rollouts are real agent episodes (the policy being trained, through a harness drawn
per rollout from `harnesses`, in a fresh sandbox of the task's image), graded by the task's tests;
BAR (`orchard.train.bar`) decides how many to run and which `group_size` of them form the task's
GRPO group. Each rollout is handed to TRL as prompt tokens (system + task, rendered with the
harness's tools), completion tokens (every later turn: the policy's replies and the observations),
`env_mask` (1 on the policy's own tokens only, so observations never carry loss) and the sampling
log-probabilities. Rewards: +1 resolved, -1 otherwise (configurable), optionally plus
`judge_weight` x a judge model's rubric score in [0, 1] (R + alpha J).

Per training step it logs the mean reward, the share of informative groups (rewards not all
equal), rollouts spent per group and rollouts saved against the budget.
"""

from __future__ import annotations

import functools
import random
import re
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from orchard.agents import harness_factory
from orchard.agents.loop import Limits, run_episode
from orchard.agents.models import TransformersModel
from orchard.errors import ConfigError, OrchardError
from orchard.tasks.grading import grade_patch
from orchard.train import quiet
from orchard.train.bar import BARConfig, Rollout, balanced_rollout
from orchard.train.sft import assistant_spans

if TYPE_CHECKING:
    from orchard.agents.models import Model
    from orchard.env.client import Client
    from orchard.tasks.schema import SWETask

RUBRIC = """Score this software engineering attempt from 0 to 1: did it investigate before editing,
make a focused change, and check its work? Answer with one number."""
_NUMBER = re.compile(r"(?<![\d.])(0(?:\.\d+)?|1(?:\.0+)?|\.\d+)(?![\d.])")


@dataclass
class RLSettings:
    bar: BARConfig = field(default_factory=lambda: BARConfig(group_size=4, max_rollouts=8, stride=4))
    harnesses: tuple[str, ...] = ("bash",)
    max_steps: int = 2
    learning_rate: float = 1e-5
    episode_steps: int = 4
    max_new_tokens: int = 64
    max_completion_length: int = 4096
    temperature: float = 1.0
    success_reward: float = 1.0
    failure_reward: float = -1.0
    judge_weight: float = 0.0
    beta: float = 0.0
    seed: int = 0
    bf16: bool = False
    use_vllm: bool = False
    parallel: int = 4
    """Rollouts of a stride run at once."""


@dataclass
class StepStats:
    rewards: list[float] = field(default_factory=list)
    groups: int = 0
    informative: int = 0
    spent: int = 0
    saved: int = 0


class SandboxRollouts:
    """TRL's `rollout_func`: BAR groups of real sandboxed episodes for the prompts of a batch."""

    def __init__(
        self,
        tasks: Sequence[SWETask],
        images: dict[str, str],
        client: Client,
        settings: RLSettings,
        judge: Model | None = None,
        on_step: Callable[[int, dict[str, float]], object] | None = None,
    ):
        self.client, self.images, self.settings, self.judge = client, images, settings, judge
        self.on_step = on_step
        self.by_prompt = {self.prompt_key(t): t for t in tasks}
        self.rng = random.Random(settings.seed)
        self.history: list[dict[str, float]] = []

    @staticmethod
    def prompt_key(task: SWETask) -> str:
        return f"[{task.instance_id}] {task.problem_statement}"

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        tokenizer = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        policy = TransformersModel(
            model=model,
            tokenizer=tokenizer,
            temperature=self.settings.temperature,
            max_new_tokens=self.settings.max_new_tokens,
            name="policy",
        )
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "reward": []}
        stats = StepStats()
        try:
            size = self.settings.bar.group_size
            # TRL repeats each prompt `num_generations` (= group size) times in a row: one BAR group each
            for prompt in prompts[::size]:
                text = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
                task = self.by_prompt.get(text)
                if task is None:
                    raise ConfigError(f"a prompt of the dataset names no task of this run: {text[:80]!r}")
                group = balanced_rollout(functools.partial(self._stride, task, policy), self.settings.bar)
                stats.groups += 1
                stats.informative += int(group.informative)
                stats.spent += group.spent
                stats.saved += self.settings.bar.max_rollouts - group.spent
                for rollout in group.rollouts:
                    stats.rewards.append(rollout.reward)
                    for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask"):
                        out[key].append(rollout.payload[key])
                    out["reward"].append(rollout.reward)
        finally:
            model.train(was_training)
        metrics = {
            "bar/reward_mean": statistics.fmean(stats.rewards) if stats.rewards else 0.0,
            "bar/informative_share": stats.informative / max(1, stats.groups),
            "bar/rollouts_per_group": stats.spent / max(1, stats.groups),
            "bar/rollouts_saved": float(stats.saved),
        }
        self.history.append({k.removeprefix("bar/"): v for k, v in metrics.items()})
        if self.on_step is not None:
            self.on_step(int(trainer.state.global_step), metrics)
        return out

    def _stride(self, task: SWETask, policy: TransformersModel, count: int) -> list[Rollout]:
        """`count` rollouts at once: sandboxes and grading overlap, generation takes turns on the device."""
        with ThreadPoolExecutor(max_workers=max(1, min(count, self.settings.parallel))) as pool:
            return list(pool.map(lambda _: self._rollout(task, policy), range(count)))

    def _rollout(self, task: SWETask, policy: TransformersModel) -> Rollout:
        try:
            return self._episode(task, policy)
        except OrchardError as exc:  # a sandbox that would not start, a grading failure: not a crash
            messages = [
                {"role": "user", "content": SandboxRollouts.prompt_key(task)},
                {"role": "assistant", "content": ""},
            ]
            payload = self._tokens(policy, [messages[0], messages[0], messages[1]], None)
            return Rollout(
                success=False,
                reward=self.settings.failure_reward,
                status="aborted",
                payload=payload | {"error": str(exc)},
            )

    def _episode(self, task: SWETask, policy: TransformersModel) -> Rollout:
        image = self.images[task.instance_id]
        harness = harness_factory(self.rng.choice(self.settings.harnesses))()
        with self.client.create(image, memory="4Gi") as box:
            episode = run_episode(
                task,
                harness,
                policy.session(task, harness),
                box,
                model_name=policy.name,
                limits=Limits(max_steps=self.settings.episode_steps),
            )
        resolved = bool(episode.patch.strip()) and grade_patch(self.client, task, episode.patch, image).resolved
        reward = self.settings.success_reward if resolved else self.settings.failure_reward
        if self.judge is not None and self.settings.judge_weight:
            reward += self.settings.judge_weight * self._rubric(task, episode.messages)
        payload = self._tokens(policy, episode.messages, episode.tools)
        return Rollout(success=resolved, reward=reward, status=episode.status, payload=payload)

    def _rubric(self, task: SWETask, messages: list[dict[str, Any]]) -> float:
        assert self.judge is not None
        from orchard.agents.bash import BashHarness

        shown = "\n".join(f"{m['role']}: {str(m.get('content') or '')[:500]}" for m in messages[2:])[-8000:]
        reply = self.judge.session(task, BashHarness()).complete(
            [
                {"role": "system", "content": RUBRIC},
                {"role": "user", "content": f"{task.problem_statement[:2000]}\n\n{shown}"},
            ],
            None,
        )
        match = _NUMBER.search(reply.content or "")
        return min(1.0, max(0.0, float(match.group(1)))) if match else 0.0

    def _tokens(self, policy: TransformersModel, messages: list[dict[str, Any]], tools: Any) -> dict[str, list]:
        """Prompt and completion token ids, the env mask and the sampling log-probabilities."""
        import torch

        tokenizer, model = policy.tokenizer, policy.model
        prompt_text = tokenizer.apply_chat_template(
            messages[:2], tools=tools or None, tokenize=False, add_generation_prompt=True
        )
        full_text, spans = assistant_spans(tokenizer, messages, tools)
        encoded = tokenizer(full_text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        cut = next((i for i, (begin, _end) in enumerate(offsets) if begin >= len(prompt_text)), len(ids))
        limit = cut + self.settings.max_completion_length
        prompt_ids, completion_ids = ids[:cut], ids[cut:limit]
        mask = [int(any(a <= begin and end <= b for a, b in spans)) for begin, end in offsets[cut:limit]]
        with policy._lock, torch.no_grad():
            device = next(model.parameters()).device
            logits = model(input_ids=torch.tensor([ids[:limit]], device=device)).logits[0]
            logps = torch.log_softmax(logits.float(), dim=-1)
            targets = torch.tensor(completion_ids, device=device)
            positions = torch.arange(cut - 1, cut - 1 + len(completion_ids), device=device)
            sampled = logps[positions, targets].tolist() if completion_ids else []
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": sampled, "env_mask": mask}


def reward_from_rollout(prompts: Any, completions: Any, reward: list[float], **_: Any) -> list[float]:
    """The reward BAR's rollouts were scored with, passed through by TRL from `rollout_func`."""
    return list(reward)


def train_rl(
    model_path: str,
    tasks: Sequence[SWETask],
    images: dict[str, str],
    client: Client,
    output_dir: str,
    settings: RLSettings | None = None,
    judge: Model | None = None,
    callbacks: list | None = None,
    on_step: Callable[[int, dict[str, float]], object] | None = None,
) -> dict[str, Any]:
    """GRPO with BAR-assembled groups for `settings.max_steps` steps; the policy goes to `output_dir`."""
    import os

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    settings = settings or RLSettings()
    group = settings.bar.group_size
    rollouts = SandboxRollouts(tasks, images, client, settings, judge, on_step)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": SandboxRollouts.prompt_key(t)}]} for t in tasks]
    )
    args = GRPOConfig(
        output_dir=output_dir,
        learning_rate=settings.learning_rate,
        max_steps=settings.max_steps,
        per_device_train_batch_size=group,
        num_generations=group,
        steps_per_generation=1,
        max_completion_length=settings.max_completion_length,
        beta=settings.beta,
        seed=settings.seed,
        bf16=settings.bf16,
        use_vllm=settings.use_vllm,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_path),
        reward_funcs=cast(Any, reward_from_rollout),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollouts,
        callbacks=callbacks,
    )
    quiet(trainer).train()
    trainer.save_model(output_dir)
    tokenizer.save_pretrained(output_dir)
    logged = [e for e in trainer.state.log_history if "loss" in e]
    return {
        "steps": trainer.state.global_step,
        "losses": [e["loss"] for e in logged],
        "bar": rollouts.history,
        "output_dir": output_dir,
    }

"""RL with Balanced Adaptive Rollout: multi-turn episodes in sandboxes, GRPO advantages, TRL's trainer.

TRL's `GRPOTrainer` does the optimisation; Orchard plugs in through `rollout_func`. For each task
in a batch, rollouts are real agent episodes (the policy being trained, through a harness drawn
per rollout from `harnesses`, in a fresh sandbox of the task's image), graded by the task's tests;
BAR (`orchard.train.bar`) decides how many to run and which `group_size` of them form the task's
GRPO group. Each rollout is handed to TRL as prompt tokens (system + task, rendered with the
harness's tools), completion tokens (every later turn: the policy's replies and the observations),
`env_mask` (1 on the policy's own tokens only, so observations never carry loss): the finished
conversation re-tokenized, also when a server (vLLM, llama.cpp) generated it. TRL's vLLM
importance-sampling correction is off, so no sampling log-probabilities are computed (they are
NaN, TRL's "not available"); a step whose groups are all uninformative has no gradient and reaches
TRL as one-token stubs, an update that costs next to nothing. Tasks may be of
any kind: each rollout is one attempt (`orchard.eval.attempt`), and its reward follows the grade's
score from -1 (score 0) to +1 (score 1, resolved; both configurable), optionally plus
`judge_weight` x a judge model's rubric score in [0, 1] (R + alpha J). While it trains, as many
sandboxes of each browser kind's image as a stride runs at once are kept started, Chromium
running (`TaskPools`), and drained at the end.

Per training step it logs the groups formed, the mean reward, the share of informative groups
(rewards not all equal), rollouts spent per group and rollouts saved against the budget, summed
over the processes of a multi-process launch. With a run id, rollouts are stored as graded
trajectories of that run (not those a failure of ours aborted), so the value model learns from them.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import math
import random
import re
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from orchard.agents.loop import Limits, record_verdict, save_episode
from orchard.agents.models import ModelError, TransformersModel
from orchard.errors import ConfigError, OrchardError
from orchard.eval.attempt import TaskPools, played
from orchard.store import Store
from orchard.train import lora_config, quiet, save_trained, shared_args
from orchard.train.bar import PassRates, Rollout, balanced_rollout, fixed_rollouts_per_informative
from orchard.train.config import RLConfig
from orchard.train.sft import assistant_spans
from orchard.train.student import student_at

if TYPE_CHECKING:
    from orchard.agents.llamacpp import LlamaServer
    from orchard.agents.models import Model
    from orchard.env.client import Client
    from orchard.tasks.base import TaskBase

RUBRIC = """Score this agent's attempt at its task from 0 to 1: did it investigate before acting,
make focused changes, and check its work? Answer with one number."""
_NUMBER = re.compile(r"(?<![\d.])(0(?:\.\d+)?|1(?:\.0+)?|\.\d+)(?![\d.])")


@dataclass
class StepStats:
    rewards: list[float] = field(default_factory=list)
    groups: int = 0
    informative: int = 0
    settled: int = 0
    spent: int = 0
    saved: int = 0

    @staticmethod
    def merged(parts: Sequence[StepStats]) -> StepStats:
        return StepStats(
            rewards=[r for p in parts for r in p.rewards],
            groups=sum(p.groups for p in parts),
            informative=sum(p.informative for p in parts),
            settled=sum(p.settled for p in parts),
            spent=sum(p.spent for p in parts),
            saved=sum(p.saved for p in parts),
        )


class SandboxRollouts:
    """TRL's `rollout_func`: BAR groups of real sandboxed episodes for the prompts of a batch."""

    def __init__(
        self,
        tasks: Sequence[TaskBase],
        images: dict[str, str],
        client: Client,
        settings: RLConfig,
        judge: Model | None = None,
        on_step: Callable[[int, dict[str, float]], object] | None = None,
        run_id: str | None = None,
        store: Store | None = None,
        serve: str = "transformers",
        scratch: str | None = None,
    ):
        """`serve`: "llama.cpp" generates on llama-server, the policy exported to GGUF in `scratch`
        before each step's rollouts (`orchard.agents.llamacpp`)."""
        self.client, self.images, self.settings, self.judge = client, images, settings, judge
        self.serve, self.scratch = serve, scratch
        self.llama: LlamaServer | None = None
        self.on_step = on_step
        self.run_id, self.store = run_id, store
        """With a run id, every rollout is stored as a graded trajectory of that run (for the value model)."""
        self._samples: Iterator[int] = itertools.count()
        self._numbered = False
        self.vllm: VLLMServer | None = None
        self.by_prompt = {self.prompt_key(t): t for t in tasks}
        self.rng = random.Random(settings.seed)
        self.history: list[dict[str, float]] = []
        self.memory = PassRates(settings.settle_after) if settings.bar_memory else None
        """What each task's rollouts did so far, across steps and epochs (BAR with memory)."""
        self.seen = PassRates()
        """Every rollout's outcome by task, memory or not: the pass rates fixed groups are costed at."""
        self.groups: list[tuple[str, int, bool]] = []
        """Each group formed: its task, the rollouts spent on it, whether it is informative."""

    @staticmethod
    def prompt_key(task: TaskBase) -> str:
        return f"[{task.instance_id}] {task.problem_statement}"

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        tokenizer = trainer.processing_class
        if not self._numbered:  # stored rollouts are numbered across processes: rank, rank + N, ...
            accelerator, self._numbered = trainer.accelerator, True
            self._samples = itertools.count(accelerator.process_index, accelerator.num_processes)
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        generate: Callable[[list[int]], list[int]] | None = None
        if self.settings.use_vllm:
            generate = self._server(trainer)
        elif self.serve == "llama.cpp":
            generate = self._served(model, tokenizer)
        policy = TransformersModel(
            model=model,
            tokenizer=tokenizer,
            temperature=self.settings.temperature,
            max_new_tokens=self.settings.max_new_tokens,
            name="policy",
            generate=generate,
        )
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "reward": []}
        stats = StepStats()
        groups = []
        try:
            size = self.settings.bar.group_size
            # TRL repeats each prompt `num_generations` (= group size) times in a row: one BAR group each
            for prompt in prompts[::size]:
                text = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
                task = self.by_prompt.get(text)
                if task is None:
                    raise ConfigError(f"a prompt of the dataset names no task of this run: {text[:80]!r}")
                group = balanced_rollout(
                    functools.partial(self._stride, task, policy),
                    self.settings.bar,
                    memory=self.memory,
                    task=task.instance_id,
                )
                self.seen.record(task.instance_id, group.pool)
                self.groups.append((task.instance_id, group.spent, group.informative))
                stats.groups += 1
                stats.informative += int(group.informative)
                stats.settled += int(group.kind == "settled")
                stats.spent += group.spent
                stats.saved += self.settings.bar.max_rollouts - group.spent
                groups.append(group)
        finally:
            model.train(was_training)
        # A step whose every group's rewards agree has no gradient (GRPO's advantages are all zero,
        # and with beta 0 there is no KL term): its rollouts reach TRL cut to their last prompt token
        # and first completion token, so that the update costs next to nothing.
        idle = self.settings.beta == 0 and not any(group.informative for group in groups)
        for rollout in (rollout for group in groups for rollout in group.rollouts):
            stats.rewards.append(rollout.reward)
            for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask"):
                tokens = rollout.payload[key]
                if idle:  # one token each, counted in the loss (an all-masked batch would divide by zero)
                    tokens = tokens[-1:] if key == "prompt_ids" else [1] if key == "env_mask" else tokens[:1]
                out[key].append(tokens)
            out["reward"].append(rollout.reward)
        if trainer.accelerator.num_processes > 1:  # each process rolled out its own groups: sum them
            from accelerate.utils import gather_object

            stats = StepStats.merged(gather_object([stats]))
        metrics = {
            "bar/groups": float(stats.groups),
            "bar/reward_mean": statistics.fmean(stats.rewards) if stats.rewards else 0.0,
            "bar/informative_share": stats.informative / max(1, stats.groups),
            "bar/rollouts_per_group": stats.spent / max(1, stats.groups),
            "bar/rollouts_per_informative": stats.spent / max(1, stats.informative),
            "bar/settled": float(stats.settled),
            "bar/rollouts_saved": float(stats.saved),
        }
        self.history.append({k.removeprefix("bar/"): v for k, v in metrics.items()})
        if self.on_step is not None and trainer.accelerator.is_main_process:
            self.on_step(int(trainer.state.global_step), metrics)
        return out

    def _server(self, trainer: Any) -> VLLMServer:
        if self.vllm is None:
            args = trainer.args
            url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
            self.vllm = VLLMServer(url, self.settings.max_new_tokens, self.settings.temperature)
        return self.vllm

    def _served(self, model: Any, tokenizer: Any) -> Callable[[list[int]], list[int]]:
        """The policy as it is now, on a llama-server of its own (the last step's is closed)."""
        import copy

        from orchard.agents.llamacpp import LlamaServer, export_gguf

        assert self.scratch is not None, "llama.cpp rollouts need a scratch folder"
        if self.llama is not None:
            self.llama.close()
        if hasattr(model, "merge_and_unload"):  # LoRA adapters: merged into a copy, the trainer's stays
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(self.scratch)
        tokenizer.save_pretrained(self.scratch)
        self.llama = server = LlamaServer(export_gguf(self.scratch), parallel=self.settings.parallel)
        settings = self.settings
        return lambda ids: server.generate(ids, max_tokens=settings.max_new_tokens, temperature=settings.temperature)

    def cost(self) -> dict[str, float | None]:
        """Rollouts BAR spent per informative group in this process, against what fixed groups of
        `group_size` would have spent on the same tasks at the pass rates the run saw (each task's
        share of successes over all its rollouts)."""
        spent = sum(s for _t, s, _i in self.groups)
        informative = sum(i for _t, _s, i in self.groups)
        outcomes = self.seen.outcomes
        rates = [sum(outcomes[t]) / len(outcomes[t]) for t, _s, _i in self.groups]
        fixed = fixed_rollouts_per_informative(rates, self.settings.bar.group_size)
        measured = spent / informative if informative else None  # None: no informative group at all
        return {
            "groups": float(len(self.groups)),
            "rollouts": float(spent),
            "informative": float(informative),
            "rollouts_per_informative": measured,
            "fixed_rollouts_per_informative": fixed if math.isfinite(fixed) else None,
            "saving": fixed / measured if measured and math.isfinite(fixed) else None,
        }

    def close(self) -> None:
        """Stop the servers rollouts generated on."""
        if self.vllm is not None:
            self.vllm.close()
        if self.llama is not None:
            self.llama.close()

    def _stride(self, task: TaskBase, policy: TransformersModel, count: int) -> list[Rollout]:
        """`count` rollouts at once: sandboxes and grading overlap, generation takes turns on the device."""
        with ThreadPoolExecutor(max_workers=max(1, min(count, self.settings.parallel))) as pool:
            return list(pool.map(lambda _: self._rollout(task, policy), range(count)))

    def _rollout(self, task: TaskBase, policy: TransformersModel) -> Rollout:
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

    def _episode(self, task: TaskBase, policy: TransformersModel) -> Rollout:
        harness = self.rng.choice(self.settings.harnesses or ())
        limits = Limits(episode_steps=self.settings.episode_steps)
        image = self.images[task.instance_id]
        seen = played(task, harness, policy, self.client, image, limits=limits)
        episode = seen.episode
        grade = task.grade(self.client, episode.submission, image)
        resolved = grade.resolved
        if self.run_id is not None and seen.machine_fault is None:  # a failure of ours says nothing of the policy
            save_episode(episode, run_id=self.run_id, sample=next(self._samples), store=self.store)
            record_verdict(episode.trajectory_id, grade.outcome, resolved, store=self.store)
        low, high = self.settings.failure_reward, self.settings.success_reward
        reward = low + (high - low) * grade.score  # SWE: +1 resolved, -1 not; partial credit in between
        if self.judge is not None and self.settings.judge_weight:
            reward += self.settings.judge_weight * self._rubric(task, episode.messages)
        payload = self._tokens(policy, episode.messages, episode.tools)
        return Rollout(success=resolved, reward=reward, status=episode.status, payload=payload)

    def _rubric(self, task: TaskBase, messages: list[dict[str, Any]]) -> float:
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
        """Prompt and completion token ids, the env mask, and log-probabilities NaN: TRL reads them only
        for its vLLM importance-sampling correction, which is off (NaN is its "not available")."""
        tokenizer = policy.tokenizer
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
        logprobs = [math.nan] * len(completion_ids)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs, "env_mask": mask}


class VLLMServer:
    """Generation on the vLLM server that TRL keeps in step with the policy (`trl vllm-serve`;
    `use_vllm`, `vllm_mode="server"`: TRL pushes the new weights before each batch of rollouts).

    Token ids in, token ids out, through the server's OpenAI-compatible `/v1/completions`, so the
    prompt is the policy's own chat template with tools, exactly as in-process generation renders
    it. Each episode turn is one request; the server batches the turns of concurrent rollouts."""

    def __init__(self, base_url: str, max_new_tokens: int, temperature: float, *, timeout: float = 600.0):
        import httpx

        self.url = base_url.rstrip("/").removesuffix("/v1")  # TRL's form; the OpenAI form works too
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self._http = httpx.Client(base_url=self.url, timeout=timeout)
        try:
            self.model = str(self._http.get("/v1/models").raise_for_status().json()["data"][0]["id"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            self.close()
            raise ConfigError(f"no vLLM server at {self.url} ({exc}): start one with trl vllm-serve") from None

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        import httpx

        body = {
            "model": self.model,
            "prompt": [prompt_ids],
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            # plain temperature sampling, as in-process; vLLM would otherwise take the model's
            # generation_config defaults (top-k 20, top-p 0.95 for Qwen3)
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "return_token_ids": True,
        }
        try:
            choice = self._http.post("/v1/completions", json=body).raise_for_status().json()["choices"][0]
            return [int(t) for t in choice["token_ids"]]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise ModelError(f"vLLM server {self.url}: {exc}") from None

    def close(self) -> None:
        self._http.close()


def reward_from_rollout(prompts: Any, completions: Any, reward: list[float], **_: Any) -> list[float]:
    """The reward BAR's rollouts were scored with, passed through by TRL from `rollout_func`."""
    return list(reward)


def train_rl(
    model_path: str,
    tasks: Sequence[TaskBase],
    images: dict[str, str],
    client: Client,
    output_dir: str,
    config: RLConfig | None = None,
    judge: Model | None = None,
    callbacks: list | None = None,
    on_step: Callable[[int, dict[str, float]], object] | None = None,
    run_id: str | None = None,
    store: Store | None = None,
    serve: str = "transformers",
) -> dict[str, Any]:
    """GRPO with BAR-assembled groups for `config.max_steps` steps, TRL's arguments taken from `config`;
    the policy goes to `output_dir`. With `run_id`, every rollout is stored as a graded trajectory of
    that run. `serve`: where the rollouts generate (`SandboxRollouts`)."""
    import os

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    config = config or RLConfig()
    if not config.harnesses and tasks:  # none named: the harnesses the tasks' kind is worked through
        config = config.model_copy(update={"harnesses": list(type(tasks[0]).harnesses)})
    if config.use_vllm and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "rl.use_vllm needs vLLM next to TRL (a GPU machine): pip install vllm, then start "
            "trl vllm-serve --model STUDENT before training"
        )
    group = config.bar.group_size
    scratch = None
    if serve == "llama.cpp":  # this process's policy, exported for llama-server each step
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=".rollout-policy-", dir=output_dir)
    rollouts = SandboxRollouts(
        tasks, images, client, config, judge, on_step, run_id, store, serve=serve, scratch=scratch
    )
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": SandboxRollouts.prompt_key(t)}]} for t in tasks]
    )
    args = GRPOConfig(
        output_dir=output_dir,
        learning_rate=config.learning_rate,
        max_steps=config.max_steps,
        per_device_train_batch_size=group,
        num_generations=group,
        steps_per_generation=1,
        max_completion_length=config.max_completion_length,
        beta=config.beta,
        seed=config.seed,
        bf16=config.bf16,
        gradient_checkpointing=config.gradient_checkpointing,
        use_vllm=config.use_vllm,
        vllm_mode="server",
        vllm_server_base_url=config.vllm_server if config.use_vllm else None,
        vllm_importance_sampling_correction=False,  # the rollouts carry no sampling log-probs, see _tokens
        ddp_find_unused_parameters=False,
        **shared_args(),
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    student = student_at(model_path)
    student.check_rl_harnesses(config.harnesses or ())
    trainer = GRPOTrainer(
        model=student.auto_class().from_pretrained(model_path),
        reward_funcs=cast(Any, reward_from_rollout),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollouts,
        callbacks=callbacks,
        peft_config=lora_config(config.lora_rank) if config.lora else None,
    )
    pools = TaskPools(client, min(config.parallel, config.stride))  # browser sandboxes, ahead of the rollouts
    try:
        with pools.warm(((t, images[t.instance_id]) for t in tasks), counted=False):
            quiet(trainer).train()
    finally:
        rollouts.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    save_trained(trainer, output_dir)
    if trainer.accelerator.is_main_process:
        student.save_beside(output_dir)
    logged = [e for e in trainer.state.log_history if "loss" in e]
    return {
        "steps": trainer.state.global_step,
        "losses": [e["loss"] for e in logged],
        "bar": rollouts.history,
        "bar_cost": rollouts.cost(),
        "output_dir": output_dir,
    }

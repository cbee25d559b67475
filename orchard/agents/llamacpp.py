"""`llama:PATH`: a checkpoint's chat template and tool calls, generating on llama.cpp's server.

On a CPU, rollouts and evaluation cost more than training: transformers generates one token of one
sequence per forward pass and evaluates every turn's whole prompt again. `llama-server` batches
the requests of concurrent episodes (continuous batching over `parallel` slots) and keeps each
slot's prompt cached, so a turn evaluates only what the turn before added. The checkpoint folder
(`hf:`'s, a training stage's output) is exported to GGUF next to itself (`model.gguf`, redone when
the weights are newer) by llama.cpp's own converter, and served on loopback; the prompt is still
rendered and the reply still parsed here (`TransformersModel`), so `llama:` and `hf:` see the same
text. Both the server and the converter are built once from the llama.cpp sources that PyPI's
`llama-cpp-python` sdist carries (`orchard model llama-server`), into
`$ORCHARD_CACHE_DIR/llama.cpp/VERSION`: no other registry, no GitHub.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from orchard.agents.models import ModelServerError, TransformersModel
from orchard.errors import ConfigError

VERSION = "0.3.36"
"""The `llama-cpp-python` sdist whose vendored llama.cpp is built."""
SERVER = "llama-server"
CONVERTER = "convert_hf_to_gguf.py"
GGUF_NAME = "model.gguf"
CONTEXT = 4096
"""Tokens of context per slot."""


def home() -> Path:
    from orchard.config import settings

    return settings().cache_dir / "llama.cpp" / VERSION


def built() -> Path | None:
    """The folder holding the server and the converter, when they are built."""
    folder = home()
    return folder if (folder / SERVER).is_file() and (folder / CONVERTER).is_file() else None


def build(log: Any = print) -> Path:
    """Build `llama-server` (static, for this CPU) from the sdist on PyPI, once; keep its converter."""
    found = built()
    if found is not None:
        return found
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise ConfigError(f"building llama.cpp needs {tool}: install it (apt-get install cmake g++)")
    target = home()
    with tempfile.TemporaryDirectory(prefix="orchard-llama-") as scratch:
        work = Path(scratch)
        log(f"fetching llama-cpp-python {VERSION}'s sources from PyPI")
        pip = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={VERSION}", "--no-deps"]
        subprocess.run([*pip, "--no-binary", ":all:", "-d", str(work)], check=True, capture_output=True)
        (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            archive.extractall(work, members=members, filter="data")
        source = work / prefix
        log("building llama-server (a few minutes per core, once)")
        flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF"]
        flags += ["-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(
            ["cmake", "-S", source, "-B", source / "build", *generator, *flags], check=True, capture_output=True
        )
        jobs = str(os.cpu_count() or 2)
        subprocess.run(
            ["cmake", "--build", source / "build", "--target", SERVER, "-j", jobs], check=True, capture_output=True
        )
        staged = Path(tempfile.mkdtemp(prefix=".building-", dir=_parent(target)))
        shutil.copy2(source / "build" / "bin" / SERVER, staged / SERVER)
        shutil.copy2(source / CONVERTER, staged / CONVERTER)
        for folder in ("gguf-py", "conversion"):  # what the converter imports
            if (source / folder).is_dir():
                shutil.copytree(source / folder, staged / folder)
        staged.chmod(0o755)
        staged.rename(target)
    return target


def _parent(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return target.parent


def export_gguf(folder: str | Path, *, outtype: str = "bf16") -> Path:
    """`folder`'s checkpoint as `folder/model.gguf` (made again when a weight file is newer)."""
    folder = Path(folder)
    out = folder / GGUF_NAME
    weights = [p.stat().st_mtime for p in folder.glob("*.safetensors")]
    if out.is_file() and weights and out.stat().st_mtime >= max(weights):
        return out
    if not weights:
        raise ConfigError(f"llama: {folder} holds no safetensors weights to export")
    tools = built()
    if tools is None:
        raise ConfigError("llama: needs llama.cpp's server: build it once with `orchard model llama-server`")
    partial = folder / f".{GGUF_NAME}.partial"
    result = subprocess.run(
        [sys.executable, tools / CONVERTER, folder, "--outfile", partial, "--outtype", outtype],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(f"llama: could not export {folder} to GGUF: {last}")
    partial.replace(out)
    return out


class LlamaServer:
    """`llama-server` on a GGUF file, on a free loopback port, until `close()` (or exit)."""

    def __init__(self, gguf: str | Path, *, parallel: int = 4, context: int = CONTEXT, threads: int | None = None):
        tools = built()
        if tools is None:
            raise ConfigError("llama: needs llama.cpp's server: build it once with `orchard model llama-server`")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        threads = threads or os.cpu_count() or 2
        command = [
            str(tools / SERVER),
            "-m",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-np",
            str(parallel),
        ]
        command += ["-c", str(context * parallel), "-t", str(threads), "-tb", str(threads), "--no-webui"]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (kept open for the server's life)
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        atexit.register(self.close)
        self._wait()

    def _wait(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._log.seek(0)
                tail = self._log.read().decode(errors="replace").strip().splitlines()[-3:]
                raise ModelServerError(f"llama-server exited with {self.process.returncode}: {' | '.join(tail)}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        self.close()
        raise ModelServerError(f"llama-server did not come up within {timeout:.0f} s")

    def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float) -> list[int]:
        """Completion token ids; greedy at temperature 0, else plain temperature sampling."""
        body = {
            "prompt": prompt_ids,
            "n_predict": max_tokens,
            "temperature": temperature,
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "typical_p": 1.0,
            "repeat_penalty": 1.0,
            "cache_prompt": True,
            "return_tokens": True,
        }
        request = urllib.request.Request(
            f"{self.url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:
                return [int(t) for t in json.load(answer)["tokens"]]
        except (OSError, ValueError, KeyError) as exc:
            raise ModelServerError(f"llama-server at {self.url}: {exc}") from None

    def close(self) -> None:
        atexit.unregister(self.close)  # an RL run starts one a step: none is kept alive until exit
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class LlamaCppModel(TransformersModel):
    """`llama:PATH`: the checkpoint folder PATH served by `llama-server` (see the module)."""

    def __init__(
        self,
        path: str,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        parallel: int = 8,
        name: str | None = None,
    ):
        from transformers import AutoTokenizer

        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise ConfigError(f"llama:{path}: not a checkpoint folder (no config.json)")
        self.server = LlamaServer(export_gguf(folder), parallel=parallel)
        super().__init__(
            tokenizer=AutoTokenizer.from_pretrained(folder),
            name=name or f"llama:{folder.name}",
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generate=self._served,
        )

    def _served(self, prompt_ids: list[int]) -> list[int]:
        return self.server.generate(prompt_ids, max_tokens=self.max_new_tokens, temperature=self.temperature)

    @classmethod
    def from_spec(cls, argument: str, *, max_tokens: int = 256, temperature: float = 0.0, **_: Any) -> LlamaCppModel:
        return cls(argument, max_new_tokens=max_tokens, temperature=temperature)

    def close(self) -> None:
        self.server.close()

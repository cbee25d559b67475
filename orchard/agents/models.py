"""Models the agent loop can drive, named by a spec string:

* `scripted:gold` replays, for each task, a script made from its gold patch (look around, apply
  the fix, check, submit) in whatever harness is used; `scripted:regress` does the same but
  reverts the fix before submitting (unresolved, with one productive stretch); `scripted:FILE` replays steps from a JSON
  file (`{instance_id: [step, ...]}`, steps as `orchard.agents.base.Step` fields); `noop`
  submits at once. For tests and offline demos.
* `openai:MODEL` (any OpenAI-compatible server: vLLM, SGLang, Ollama, hosted APIs), with the
  server from `--base-url` / `OPENAI_BASE_URL` and the key from `OPENAI_API_KEY` (or none).
* `hf:PATH` a local `transformers` causal LM (a folder), generating on this machine.

A model hands out one `ModelSession` per episode (`session(task, harness)`), so sessions can run
in parallel and keep per-episode state.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from orchard.agents.base import Harness, Message, Reply, Step, ToolCall
from orchard.errors import ConfigError, OrchardError

if TYPE_CHECKING:
    from orchard.tasks.schema import SWETask


class ModelError(OrchardError):
    """The model could not answer (server down, out of context, ...)."""


class ModelSession(Protocol):
    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply: ...


class Model(Protocol):
    name: str

    def session(self, task: SWETask, harness: Harness) -> ModelSession: ...


# -- scripted ----------------------------------------------------------------------------


class ScriptedSession:
    """Replays steps, each written in the harness's own format; submits when they run out."""

    def __init__(self, steps: list[Step], harness: Harness):
        self.steps, self.harness, self.index = steps, harness, 0

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        step = self.steps[self.index] if self.index < len(self.steps) else Step("submit")
        self.index += 1
        reply = self.harness.encode(step, self.index)
        reply.prompt_tokens = sum(len(str(m.get("content") or "")) for m in messages) // 4
        reply.completion_tokens = max(1, len(reply.content) // 4 + sum(len(c.arguments) for c in reply.tool_calls) // 4)
        return reply


def gold_script(task: SWETask) -> list[Step]:
    """Explore a little, apply the gold patch, look at the result, submit."""
    files = re.findall(r"^diff --git a/(\S+) b/", task.patch, re.MULTILINE)
    first = files[0] if files else "."
    patch = task.patch if task.patch.endswith("\n") else task.patch + "\n"
    return [
        Step("bash", command="git status --short && ls", thought="Let me look at the repository first."),
        Step("bash", command=f"sed -n '1,60p' {first}", thought=f"The issue points at {first}; reading it."),
        Step(
            "bash",
            command=f"git apply <<'ORCHARD_EOF'\n{patch}ORCHARD_EOF",
            thought="I see the problem; applying the fix.",
        ),
        Step("bash", command="git diff --stat", thought="Checking what changed."),
        Step("submit", thought="The fix is in place."),
    ]


def regressing_script(task: SWETask) -> list[Step]:
    """The gold script, except that the fix is thrown away before submitting: unresolved, with one
    productive stretch (the fix) for credit assignment to find."""
    steps = gold_script(task)
    undo = Step(
        "bash", command="git checkout -- . && git status --short", thought="Let me start over from a clean tree."
    )
    return [*steps[:-1], undo, steps[-1]]


class ScriptedModel:
    """`scripted:gold`, `scripted:regress` (fixes, then reverts), `scripted:FILE` or `noop`."""

    def __init__(self, source: str):
        builtin = source in ("gold", "regress")
        self.name = "noop" if source == "noop" else f"scripted:{source if builtin else Path(source).name}"
        self._scripts: dict[str, list[Step]] | None = None
        self._source = source
        if source not in ("gold", "regress", "noop"):
            path = Path(source)
            try:
                data = json.loads(path.read_text())
                if not isinstance(data, dict):
                    raise TypeError("the file must hold a JSON object: {instance_id: [step, ...]}")
                self._scripts = {key: [Step(**step) for step in steps] for key, steps in data.items()}
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                raise ConfigError(f"scripted model {source}: cannot read steps ({exc})") from None

    def session(self, task: SWETask, harness: Harness) -> ScriptedSession:
        if self._source == "noop":
            return ScriptedSession([], harness)
        if self._source == "regress":
            return ScriptedSession(regressing_script(task), harness)
        if self._scripts is None:
            return ScriptedSession(gold_script(task), harness)
        return ScriptedSession(self._scripts.get(task.instance_id, []), harness)


# -- OpenAI-compatible servers -----------------------------------------------------------


class OpenAIModel:
    """Any OpenAI-compatible chat server, with tool calls or plain text."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 2048,
        timeout: float = 600.0,
    ):
        from openai import OpenAI

        self.name = model
        self.temperature, self.max_tokens = temperature, max_tokens
        self.client = OpenAI(
            base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
            timeout=timeout,
            max_retries=2,
        )

    def session(self, task: SWETask, harness: Harness) -> OpenAIModel:
        return self

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        import openai

        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        try:
            answer = self.client.chat.completions.create(
                model=self.name,
                messages=messages,  # type: ignore[arg-type]
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                **kwargs,
            )
        except openai.OpenAIError as exc:
            raise ModelError(f"the model server failed: {type(exc).__name__}: {str(exc)[:300]}") from None
        choice = answer.choices[0]
        calls = [
            ToolCall(call.id or f"call_{uuid.uuid4().hex[:8]}", call.function.name, call.function.arguments or "{}")
            for call in choice.message.tool_calls or []
            if call.type == "function"
        ]
        usage = answer.usage
        return Reply(
            content=choice.message.content or "",
            tool_calls=calls,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            finish_reason=choice.finish_reason,
        )


# -- local transformers ------------------------------------------------------------------

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


class TransformersModel:
    """A causal LM's chat template and tool-call format, generating on this machine (greedy unless
    `temperature` > 0) or through `generate`, a remote generator such as a vLLM server."""

    def __init__(
        self,
        path: str | None = None,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        model: Any = None,
        tokenizer: Any = None,
        name: str | None = None,
        generate: Callable[[list[int]], list[int]] | None = None,
    ):
        """From a folder or hub id (`path`, on the GPU where there is one); from a loaded `model` and
        `tokenizer` (a policy being trained); or from a `tokenizer` and `generate`, which turns prompt
        token ids into completion token ids elsewhere (a vLLM server that holds the policy's weights)."""
        if tokenizer is None or (model is None and generate is None):
            tokenizer, model = _load_causal_lm(path)
            name = name or f"hf:{Path(path or '').name}"
        self.name = name or "policy"
        self.tokenizer, self.model = tokenizer, model
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self._generate = generate or self._on_this_machine
        self._lock = threading.Lock()  # one generation at a time on this device

    def session(self, task: SWETask, harness: Harness) -> TransformersModel:
        return self

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        prompt: Any = self.tokenizer.apply_chat_template(
            _plain_messages(messages), tools=cast(Any, tools or None), add_generation_prompt=True, return_dict=True
        )
        prompt_ids = list(prompt["input_ids"])
        completion = self._generate(prompt_ids)
        text = str(self.tokenizer.decode(completion, skip_special_tokens=True))
        calls = []
        for index, raw in enumerate(_TOOL_CALL.findall(text)):
            try:
                call = json.loads(raw)
                calls.append(ToolCall(f"call_{index}", str(call["name"]), json.dumps(call.get("arguments", {}))))
            except (ValueError, KeyError, TypeError):
                continue
        return Reply(
            content=_TOOL_CALL.sub("", text).strip() if calls else text,
            tool_calls=calls,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(completion),
        )

    def _on_this_machine(self, prompt_ids: list[int]) -> list[int]:
        import torch

        device = next(self.model.parameters()).device
        # plain temperature sampling: not the top-k/top-p defaults of transformers or the model's generation_config
        sampling = (
            {"do_sample": True, "temperature": self.temperature, "top_k": 0, "top_p": 1.0}
            if self.temperature > 0
            else {"do_sample": False}
        )
        with self._lock, torch.no_grad():
            output = self.model.generate(
                input_ids=torch.tensor([prompt_ids], device=device),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long, device=device),
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                **sampling,
            )
        return [int(t) for t in output[0][len(prompt_ids) :]]


def _load_causal_lm(path: str | None) -> tuple[Any, Any]:
    """A tokenizer and causal LM from a folder or a hub id (the hub needs a network or the HF cache)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path or "").expanduser()
    hub_id = bool(path) and not folder.exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", path or "") is not None
    if not folder.is_dir() and not hub_id:
        raise ConfigError(f"no model folder at {path}")
    source = str(path) if hub_id else str(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype="auto")
    except OSError as exc:
        raise ConfigError(f"cannot load model {path}: {str(exc).splitlines()[0]}") from None
    if torch.cuda.is_available():
        model.to("cuda")
    return tokenizer, model.eval()


def _plain_messages(messages: list[Message]) -> list[Message]:
    """Tool-call arguments as objects, as chat templates expect them."""
    plain = []
    for message in messages:
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = dict(call["function"])
                with contextlib.suppress(ValueError, TypeError):
                    function["arguments"] = json.loads(function["arguments"])
                calls.append({**call, "function": function})
            message = {**message, "tool_calls": calls}
        plain.append(message)
    return plain


def model_from_spec(spec: str, *, base_url: str | None = None, api_key: str | None = None) -> Model:
    """`scripted:gold`, `scripted:FILE`, `noop`, `openai:NAME` or `hf:PATH`."""
    kind, _, rest = spec.partition(":")
    if spec == "noop":
        return ScriptedModel("noop")
    if kind == "scripted" and rest:
        return ScriptedModel(rest)
    if kind == "openai" and rest:
        return OpenAIModel(rest, base_url=base_url, api_key=api_key)
    if kind == "hf" and rest:
        return TransformersModel(rest)
    raise ConfigError(f"unknown model {spec!r}: use scripted:gold, scripted:FILE, noop, openai:NAME or hf:PATH")

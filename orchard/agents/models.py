"""Models the agent loop can drive, named by a spec string:

* `scripted:gold` replays, for each task, the script its kind makes from its known solution
  (`task.script("gold")`; for SWE: look around, apply the gold patch, check, submit) in whatever
  harness is used; `scripted:regress` does the same but undoes the solution before submitting
  (unresolved, with one productive stretch); `scripted:NAME` plays another script a kind makes
  (a claw task's `unsafe`); `scripted:FILE` replays steps from a JSON file
  (`{instance_id: [step, ...]}`, steps as `orchard.agents.base.Step` fields); `noop` submits at
  once. For tests and offline demos.
* `openai:MODEL` (any OpenAI-compatible server: vLLM, SGLang, llama.cpp, Ollama, hosted APIs),
  with the server from `--base-url` / `OPENAI_BASE_URL` and the key from `OPENAI_API_KEY` (one of
  the two must be given). Its `preflight()` asks the server once, before a run, whether it serves
  the model (and takes tools, when the run offers them); during a run, a server that fails
  several calls in a row raises `ModelUnavailable`.
* `hf:PATH` a local `transformers` causal LM (a folder, or a GGUF file `hf:/path/model.gguf`,
  converted once into a folder in Orchard's cache: `orchard.agents.checkpoint`), generating on
  this machine.

A model hands out one `ModelSession` per episode (`session(task, harness)`), so sessions can run
in parallel and keep per-episode state. A model may have a `preflight()`, which `check_model`
calls (`model_from_spec` does) before anything runs, and `settings`, what it makes of the options
that change its replies (a run is named by them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from orchard.agents.base import Harness, Message, Reply, Step, ToolCall, content_chars
from orchard.errors import ConfigError, OrchardError
from orchard.registry import load

if TYPE_CHECKING:
    from orchard.tasks.base import TaskBase


class ModelError(OrchardError):
    """The model could not answer (out of context, a request it made too big, ...): the episode
    ends, aborted, and that is the model's outcome."""


class ModelServerError(ModelError, ConnectionError):
    """The model's server failed the request (refused, unreachable, timed out, any status but
    those of a request too big or malformed, an answer that is no chat completion): the machine
    failed, not the model."""


class ModelUnavailable(ModelServerError):
    """The model's server has failed several calls in a row: the run stops, since every attempt
    after this one would fail the same way."""


class ModelSession(Protocol):
    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply: ...


class Model(Protocol):
    name: str

    def session(self, task: TaskBase, harness: Harness) -> ModelSession: ...


# -- scripted ----------------------------------------------------------------------------


class ScriptedSession:
    """Replays steps, each written in the harness's own format; submits when they run out."""

    replays = True
    """It plays an agent's turns only: a CLI's side calls (a title, a summary) are not its to answer."""

    def __init__(self, steps: list[Step], harness: Harness):
        self.steps, self.harness, self.index = steps, harness, 0

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        step = self.steps[self.index] if self.index < len(self.steps) else Step("submit")
        self.index += 1
        reply = self.harness.encode(step, self.index)
        reply.prompt_tokens = sum(content_chars(m.get("content")) for m in messages) // 4
        reply.completion_tokens = max(1, len(reply.content) // 4 + sum(len(c.arguments) for c in reply.tool_calls) // 4)
        return reply


class ScriptedModel:
    """`scripted:gold`, `scripted:regress` (fixes, then reverts), another script of the task's
    kind by name (`scripted:unsafe` of a claw task), `scripted:FILE` or `noop`."""

    def __init__(self, source: str):
        named = source.isidentifier()  # a script the task's kind makes; a file's name has a dot or a slash
        self.name = "noop" if source == "noop" else f"scripted:{source if named else Path(source).name}"
        self._scripts: dict[str, list[Step]] | None = None
        self._source = source
        if not named:
            path = Path(source)
            try:
                data = json.loads(path.read_text())
                if not isinstance(data, dict):
                    raise TypeError("the file must hold a JSON object: {instance_id: [step, ...]}")
                self._scripts = {key: [Step(**step) for step in steps] for key, steps in data.items()}
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                raise ConfigError(f"scripted model {source}: cannot read steps ({exc})") from None

    @classmethod
    def from_spec(cls, argument: str, **_: Any) -> ScriptedModel:
        return cls(argument)

    @property
    def settings(self) -> dict[str, Any]:
        """None of the options changes what it replays."""
        return {}

    def session(self, task: TaskBase, harness: Harness) -> ScriptedSession:
        if self._source == "noop":
            return ScriptedSession([], harness)
        if self._scripts is None:
            return ScriptedSession(task.script(self._source), harness)
        return ScriptedSession(self._scripts.get(task.instance_id, []), harness)


class RecordedModel:
    """A trajectory's own assistant turns, replayed in order (then a submit): credit by replay runs
    a trajectory again through the same loop and harness, so its actions are parsed and executed
    exactly as they were."""

    def __init__(self, messages: list[Message], name: str = "replay"):
        self.name = name
        self.replies = [_reply(m) for m in messages if m.get("role") == "assistant"]

    def session(self, task: TaskBase, harness: Harness) -> _ReplaySession:
        return _ReplaySession(self.replies, harness)


class _ReplaySession:
    replays = True

    def __init__(self, replies: list[Reply], harness: Harness):
        self.replies, self.harness, self.index = replies, harness, 0

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        self.index += 1
        if self.index <= len(self.replies):
            return self.replies[self.index - 1]
        return self.harness.encode(Step("submit"), self.index)


def _reply(message: Message) -> Reply:
    """A chat message as a reply: its function calls (an id made up, unique, where one has none) and text."""
    calls = []
    for call in message.get("tool_calls") or []:
        if (call.get("type") or "function") != "function":
            continue
        function = call.get("function") or {}
        arguments = function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        call_id = str(call.get("id") or f"call_{uuid.uuid4().hex[:12]}")
        calls.append(ToolCall(call_id, str(function.get("name")), arguments))
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, as the model wrote it
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return Reply(content=content if isinstance(content, str) else "", tool_calls=calls)


# -- OpenAI-compatible servers -----------------------------------------------------------

MODELS_FAULT = (400, 413, 422)
"""HTTP statuses that are about the model's own request (a context overflow, a request too big or
malformed: what it wrote), its outcome; every other status, like a refused or timed-out
connection or an answer that is no chat completion, is the server failing (a 500 of a server
that refuses tools, a 401 of a revoked key, a 429 after the retries)."""
PREFLIGHT_TIMEOUT = 30.0
"""Seconds the check before a run waits for the server's answer (its models, or one token)."""
PING: list[Message] = [{"role": "user", "content": "Say OK."}]
PING_CALL: list[Message] = [{"role": "user", "content": "Call the noop tool, with no arguments."}]
PING_CALL_TOKENS = 48
"""The budget of the check's one reply when a run offers tools: room for one call of `noop`."""
PING_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "noop",
            "description": "Does nothing.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
"""The tool of the check, when a run offers tools: a server that refuses tools fails it."""


class OpenAIModel:
    """Any OpenAI-compatible chat server, with tool calls or plain text.

    A request may take `request_timeout` seconds and the client retries it twice (a refused
    connection, a timeout, 429, 5xx; with backoff): a reply comes whole, so 120 s bounds one
    generation (2048 tokens at 17 a second; a slower server needs more), and a server that hangs
    holds an attempt 6 minutes, not 30. `max_failures` calls in a row that the server fails
    (`ModelServerError`), counted over every episode of this model, raise `ModelUnavailable`, as
    does every call after them.
    """

    max_failures = 3

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 2048,
        request_timeout: float = 120.0,
    ):
        from openai import OpenAI

        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        api_key = api_key or os.environ.get("OPENAI_API_KEY")
        if not base_url and not api_key:
            raise ConfigError(
                f"openai:{model} needs a server: --base-url URL (or OPENAI_BASE_URL) for one of your own, "
                "or OPENAI_API_KEY for the hosted API"
            )
        self.name = model
        self.temperature, self.max_tokens, self.request_timeout = temperature, max_tokens, request_timeout
        self.client = OpenAI(base_url=base_url, api_key=api_key or "none", timeout=request_timeout, max_retries=2)
        self.url = str(self.client.base_url).rstrip("/")
        self._lock = threading.Lock()  # the episodes share the model, and its count of failures in a row
        self._failures = 0
        self._unavailable: str | None = None

    @property
    def settings(self) -> dict[str, Any]:
        """What changes its replies: the server, the sampling temperature, the tokens per reply."""
        return {"base_url": self.url, "temperature": self.temperature, "max_tokens": self.max_tokens}

    @classmethod
    def from_spec(
        cls, argument: str, *, base_url: str | None = None, api_key: str | None = None, **options: Any
    ) -> OpenAIModel:
        return cls(argument, base_url=base_url, api_key=api_key, **options)

    def session(self, task: TaskBase, harness: Harness) -> OpenAIModel:
        return self

    def preflight(self, tools: bool = False) -> list[str]:
        """Before a run, the server's list of models, and one token of a chat when it has no list
        or the run offers `tools` (then asked with a tool and `tool_choice`, as the run will ask).
        A ConfigError, one line, when the server cannot be reached, refuses (a llama.cpp started
        without `--jinja` refuses tools), or lists models but not this one."""
        import openai

        timeout = min(self.request_timeout, PREFLIGHT_TIMEOUT)
        client = self.client.with_options(max_retries=0, timeout=timeout)
        try:
            served = _served(client.models.with_raw_response.list().http_response)
        except openai.NotFoundError:
            served = []
        except (openai.OpenAIError, ValueError) as exc:
            raise ConfigError(f"the model server at {self.url} {_answer(exc, 'GET /models', timeout)}") from None
        if served and self.name not in served and f"{self.name}:latest" not in served:  # Ollama's default tag
            shown = ", ".join(served[:10]) + (", ..." if len(served) > 10 else "")
            raise ConfigError(f"the model server at {self.url} has no model {self.name!r}: it serves {shown}")
        if not served or tools:
            ping = (
                self._request(PING_CALL, PING_TOOLS, max_tokens=PING_CALL_TOKENS)
                if tools
                else self._request(PING, None, max_tokens=1)
            )
            try:
                reply = _parsed(client.chat.completions.with_raw_response.create(**ping))
            except (openai.OpenAIError, ValueError) as exc:
                raise ConfigError(
                    f"the model server at {self.url} {_answer(exc, 'POST /chat/completions', timeout)}"
                ) from None
            if tools and not reply.tool_calls:
                return [
                    f"the model server at {self.url} answered the check with text, not a call of the tool it was "
                    "offered: if it ignores tools (llama-cpp-python without a function-calling chat format, a chat "
                    "template without tools), every step of the tools and cli harnesses ends with 'no tool call'"
                ]
        return []

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        import openai

        if self._unavailable:
            raise ModelUnavailable(self._unavailable)
        try:
            raw = self.client.chat.completions.with_raw_response.create(**self._request(messages, tools))
            reply = _parsed(raw)
        except openai.OpenAIError as exc:
            error = f"{type(exc).__name__}: {_one_line(str(exc), 300)}"
            if getattr(exc, "status_code", None) in MODELS_FAULT:
                self._count(None)  # the server answered, about the model's request
                raise ModelError(f"the model server failed: {error}") from None
            self._count(exc, error)
            raise ModelServerError(f"the model server failed: {error}") from None
        except ValueError as exc:
            self._count(exc, f"an answer that is {exc}")
            raise ModelServerError(f"the model server answered {exc}") from None
        self._count(None)
        return reply

    def _request(self, messages: list[Message], tools: list[dict[str, Any]] | None, **overrides: Any) -> dict[str, Any]:
        """A chat completion's body; `tool_choice` goes with the tools (some servers drop tools without it)."""
        request: dict[str, Any] = {
            "model": self.name,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if tools:
            request |= {"tools": tools, "tool_choice": "auto"}
        return request | overrides

    def _count(self, failure: Exception | None, error: str = "") -> None:
        """One more call in a row that the server failed (`failure`), or the end of such a row."""
        import openai

        with self._lock:
            self._failures = self._failures + 1 if failure is not None else 0
            if self._failures >= self.max_failures:
                slow = (
                    f"; if the server is only slow, raise --request-timeout (now {self.request_timeout:g} s)"
                    if isinstance(failure, openai.APITimeoutError)
                    else ""
                )
                self._unavailable = (
                    f"the model server at {self.url} did not answer {self._failures} requests in a row, so "
                    f"the run stops (last: {error}){slow}; the same command resumes the run"
                )
                raise ModelUnavailable(self._unavailable)


def _served(response: Any) -> list[str]:
    """The model ids of a `/models` answer (ValueError when it holds no list of models)."""
    try:
        return [str(entry["id"]) for entry in response.json()["data"]]
    except (ValueError, LookupError, TypeError) as exc:
        raise ValueError(f"no list of models ({type(exc).__name__}): {_body(response)}") from None


def _parsed(raw: Any) -> Reply:
    """The reply in a chat completion's answer (ValueError naming what came instead of one: an
    HTML page, JSON without `choices`, JSON cut short)."""
    response = raw.http_response
    try:
        answer = response.json()
        choice = answer["choices"][0]
        reply = _reply(choice["message"])
        usage = answer.get("usage") or {}
        reply.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        reply.completion_tokens = int(usage.get("completion_tokens") or 0)
    except (ValueError, LookupError, TypeError, AttributeError) as exc:
        raise ValueError(f"no chat completion ({type(exc).__name__}): {_body(response)}") from None
    reason = choice.get("finish_reason")
    reply.finish_reason = None if reason is None else str(reason)
    return reply


def _body(response: Any) -> str:
    """An HTTP answer in a few words: its status, content type and first characters."""
    kind = response.headers.get("content-type") or "no content type"
    return f"HTTP {response.status_code} ({kind}) {_one_line(response.text, 200)!r}"


def _answer(exc: Exception, request: str, timeout: float) -> str:
    """What the server did with `request`: the rest of a line that names the server."""
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return f"did not answer {request} within {timeout:g} s: start it, or fix --base-url"
    if isinstance(exc, openai.APIConnectionError):
        return f"cannot be reached ({request}: {exc.__cause__ or exc}): start it, or fix --base-url"
    if isinstance(exc, openai.APIStatusError):
        return f"refused {request}: {_body(exc.response)}"
    return f"answered {request} with {exc}"


def _one_line(text: str, limit: int) -> str:
    return " ".join(text.split())[:limit]


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

    @classmethod
    def from_spec(
        cls, argument: str, *, max_tokens: int = 256, temperature: float = 0.0, **_: Any
    ) -> TransformersModel:
        from orchard.agents.vision import VisionModel, holds_image_processor

        if cls is TransformersModel and holds_image_processor(argument):  # a vision-language model's folder
            return VisionModel(argument, max_new_tokens=max_tokens, temperature=temperature)
        return cls(argument, max_new_tokens=max_tokens, temperature=temperature)

    @property
    def settings(self) -> dict[str, Any]:
        """What changes its replies: the sampling temperature, the tokens per reply."""
        return {"temperature": self.temperature, "max_tokens": self.max_new_tokens}

    def session(self, task: TaskBase, harness: Harness) -> TransformersModel:
        return self

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        prompt: Any = self.tokenizer.apply_chat_template(
            _plain_messages(messages), tools=cast(Any, tools or None), add_generation_prompt=True, return_dict=True
        )
        prompt_ids = list(prompt["input_ids"])
        completion = self._generate(prompt_ids)
        text = str(self.tokenizer.decode(completion, skip_special_tokens=False))
        for special in self.tokenizer.all_special_tokens:  # not the tool-call markers some tokenizers mark special
            if special not in ("<tool_call>", "</tool_call>"):
                text = text.replace(special, "")
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
    """A tokenizer and causal LM from a folder, a GGUF file (converted once into a folder,
    `orchard.agents.checkpoint`) or a hub id (the hub needs a network or the HF cache)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchard.agents.checkpoint import model_folder

    folder = Path(model_folder(Path(path or "").expanduser()))
    hub_id = bool(path) and not folder.exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", path or "") is not None
    if not folder.is_dir() and not hub_id:
        raise ConfigError(f"no model folder (or GGUF file) at {path}")
    source = str(path) if hub_id else str(folder)
    if hub_id:
        from orchard.config import require_hub

        require_hub(source)  # offline: one line now, not half a minute of retries first
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


MODELS: dict[str, str] = {
    "scripted": "orchard.agents.models:ScriptedModel",
    "openai": "orchard.agents.models:OpenAIModel",
    "hf": "orchard.agents.models:TransformersModel",
    "llama": "orchard.agents.llamacpp:LlamaCppModel",
}
"""Model adapters by the prefix of a spec (`PREFIX:ARGUMENT`): `name -> "module:Class"`; each class
makes a model from the argument with `from_spec`. `noop` stands for `scripted:noop`."""
SPECS = "scripted:gold, scripted:regress, scripted:sed, scripted:FILE, noop, openai:NAME (with --base-url), hf:PATH, llama:PATH or module:Class[:ARGUMENT]"


def model_from_spec(
    spec: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    request_timeout: float | None = None,
    check: bool = True,
    tools: bool = False,
) -> Model:
    """The model a spec names: `PREFIX:ARGUMENT` with a prefix of `MODELS`, `noop`, or your own
    adapter as `module:Class[:ARGUMENT]` (a class with the same `from_spec`), which gets the options
    that are given (not None) as keywords (a ConfigError names one its `from_spec` does not take).
    With `check`, the model is checked (`check_model`; `tools`: the run offers tools) before it is
    returned, so a server that cannot serve it is one line before a run starts any sandbox;
    without, nothing is sent (a judge made for later, a script)."""
    prefix, _, rest = ("scripted:noop" if spec == "noop" else spec).partition(":")
    options = {"max_tokens": max_tokens, "temperature": temperature, "request_timeout": request_timeout}
    given = {key: value for key, value in options.items() if value is not None}
    if prefix in MODELS and rest:
        adapter, argument = load(MODELS, prefix, "model"), rest
    else:
        attribute, _, argument = rest.partition(":")
        if not (prefix.replace(".", "_").isidentifier() and attribute.isidentifier() and _importable(prefix)):
            raise ConfigError(f"unknown model {spec!r}: use {SPECS}")
        adapter = load({}, f"{prefix}:{attribute}", "model")
        if not callable(getattr(adapter, "from_spec", None)):
            raise ConfigError(f"model {spec!r}: {prefix}:{attribute} has no from_spec(argument, base_url=, api_key=)")
    refused = _refused(adapter.from_spec, given)
    if refused:
        raise ConfigError(f"model {spec} does not take {', '.join('--' + n.replace('_', '-') for n in refused)}")
    model = adapter.from_spec(argument, base_url=base_url, api_key=api_key, **given)
    if check:
        for warning in check_model(model, tools=tools):  # before the run: the user may stop it
            sys.stderr.write(f"warning: {warning}\n")
    return model


_ROLES: dict[str, Any] = {}
_roles_guard = threading.Lock()


def role_model(spec: str, role: str, *, check: bool = True) -> ModelSession:
    """The model playing `role` beside an agent (the judge of a grade, a simulated user), made once
    per process and server (`OPENAI_BASE_URL`) and checked first unless `check` is False; a
    ConfigError names the role. It answers `complete(messages, None)` for no task or harness."""
    key = f"{spec} {os.environ.get('OPENAI_BASE_URL', '')}"
    with _roles_guard:
        if key not in _ROLES:
            try:
                _ROLES[key] = model_from_spec(spec, check=check).session(cast(Any, None), cast(Any, None))
            except ConfigError as exc:
                raise ConfigError(f"{role}'s model: {exc}") from None
        return _ROLES[key]


def check_model(model: Model, *, tools: bool = False) -> list[str]:
    """The model's `preflight()`, where it has one (`preflight(tools=True)` when the run offers
    tools): an adapter of a server makes a request or two there and raises ConfigError, one line
    naming the server and its answer, when it cannot serve the model; what it warns of (a server
    that answers a tool's offer with text) is returned. Models without a server (scripted,
    recorded, local) have nothing to check."""
    preflight = getattr(model, "preflight", None)
    if not callable(preflight):
        return []
    said = preflight(tools=True) if tools else preflight()
    return [str(each) for each in said] if isinstance(said, list) else []


def _refused(function: Callable[..., Any], options: dict[str, Any]) -> list[str]:
    """The options a `from_spec` takes no keyword for (none when it takes `**keywords`)."""
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # no signature to read: let the call say
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    return [name for name in options if name not in parameters]


def _importable(module: str) -> bool:
    """Whether `module` can be imported (a spec's prefix that is neither a model adapter nor a module is a typo)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False

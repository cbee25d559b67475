"""The model behind a CLI harness: `ModelEndpoint` serving an attempt's model session as Chat
Completions (the real OpenAI client on loopback), the limits it keeps, and the scripted player of
the tools a CLI offers."""

from __future__ import annotations

import json

import openai
import pytest

from orchard.agents.base import Reply, Step, ToolCall
from orchard.agents.clis import ClaudeHarness, MiniHarness
from orchard.agents.external import STOP_TEXT, ModelEndpoint, _Turns
from orchard.agents.loop import Episode, Limits
from orchard.agents.models import ScriptedSession
from orchard.agents.players import play

BASH = {"type": "function", "function": {"name": "Bash", "parameters": {
    "type": "object",
    "properties": {"command": {"type": "string"}, "description": {"type": "string"}, "timeout": {"type": "number"}},
    "required": ["command"],
}}}  # fmt: skip
WRITE = {"type": "function", "function": {"name": "Write", "parameters": {
    "type": "object",
    "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["file_path", "content"],
}}}  # fmt: skip
SHELL_ARGV = {"type": "function", "function": {"name": "shell", "parameters": {
    "type": "object",
    "properties": {"command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"},
                   "justification": {"type": "string"}},
    "required": ["command", "justification"],
}}}  # fmt: skip


def test_the_player_calls_the_tools_a_cli_offers():
    call = play(Step("bash", command="ls -la", thought="look"), [WRITE, BASH], 1).tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("Bash", {"command": "ls -la"})
    call = play(Step("write", path="/a/b.py", content="x = 1\n"), [BASH, WRITE], 2).tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("Write", {"file_path": "/a/b.py", "content": "x = 1\n"})
    call = play(Step("bash", command="pytest -q", thought="test it"), [SHELL_ARGV], 3).tool_calls[0]
    assert json.loads(call.arguments) == {"command": ["bash", "-lc", "pytest -q"], "justification": "test it"}
    written = play(Step("write", path="/a/b c.py", content="it's\n"), [BASH], 4).tool_calls[0]
    assert (
        json.loads(written.arguments)["command"]
        == """mkdir -p "$(dirname '/a/b c.py')" && printf %s 'it'"'"'s\n' > '/a/b c.py'"""
    )
    assert play(Step("submit", thought="done"), [BASH], 5) == Reply(content="done")
    with pytest.raises(ValueError, match=r"no shell tool among the offered tools \(Write\)"):
        play(Step("bash", command="ls"), [WRITE], 6)


def test_the_endpoint_serves_a_model_session_to_a_real_openai_client():
    replies = iter(
        [Reply(content="thinking", tool_calls=[ToolCall("call_1", "Bash", '{"command": "ls"}')]), Reply("done")]
    )
    seen = []

    def answer(body):
        seen.append(body)
        from orchard.agents.external import completion

        return completion(next(replies), body["model"])

    endpoint = ModelEndpoint.shared()
    with endpoint.open(answer) as route:
        url = endpoint.url(route)
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=[BASH])
        assert first.choices[0].finish_reason == "tool_calls"
        assert first.choices[0].message.tool_calls[0].function.arguments == '{"command": "ls"}'
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}], stream=True)
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "done"
        assert chunks[-1].choices[0].finish_reason == "stop"
    assert [b["messages"][0]["content"] for b in seen] == ["hi", "go"]
    with pytest.raises(openai.NotFoundError):  # the route closed with its attempt
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])


class _Task:
    instance_id = "t-1"
    workdir = "/testbed"


def _turns(harness, steps, limits):
    episode = Episode("e", _Task(), harness.name, "scripted:gold", [], None, status="completed")  # type: ignore[arg-type]
    return _Turns(harness, episode, ScriptedSession(steps, harness), None, limits, None), episode  # type: ignore[arg-type]


def test_turns_keep_the_main_conversation_and_stop_the_cli_at_the_step_limit():
    harness = ClaudeHarness()
    turns, episode = _turns(harness, [Step("bash", command=f"echo {i}") for i in range(5)], Limits(episode_steps=2))
    ask = [{"role": "user", "content": "fix it"}]
    first = turns.answer({"model": "m", "messages": ask, "tools": [BASH]})
    assert first["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "Bash"
    side = turns.answer({"model": "m", "messages": [{"role": "user", "content": "a title please"}]})
    assert side["choices"][0]["message"]["content"] == "OK"  # a side call: answered, no step, script unmoved
    later = [*ask, first["choices"][0]["message"], {"role": "tool", "tool_call_id": "x", "content": "0"}]
    second = turns.answer({"model": "m", "messages": later, "tools": [BASH]})
    assert json.loads(second["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "command": "echo 1"
    }
    last = [*later, second["choices"][0]["message"], {"role": "tool", "tool_call_id": "y", "content": "1"}]
    stop = turns.answer({"model": "m", "messages": last, "tools": [BASH]})
    assert stop["choices"][0]["message"] == {"role": "assistant", "content": STOP_TEXT.format(what="step limit")}
    assert turns.answer({"model": "m", "messages": last, "tools": [BASH]})[0] == 400
    assert len(episode.steps) == 2 and turns.stopped == "truncated"
    assert episode.messages == [*later, second["choices"][0]["message"]]
    assert [step.observation for step in episode.steps] == ["0", "1"]  # each step's: what its actions showed


def test_mini_submits_with_its_marker_command():
    harness = MiniHarness()
    turns, episode = _turns(harness, [Step("bash", command="git diff", thought="check")], Limits())
    ask = [{"role": "system", "content": "..."}, {"role": "user", "content": "fix it"}]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]  # fmt: skip
    calls = [turns.answer({"model": "m", "messages": ask, "tools": tools})["choices"][0]["message"] for _ in range(2)]
    commands = [json.loads(c["tool_calls"][0]["function"]["arguments"])["command"] for c in calls]
    assert commands == ["git diff", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    assert len(episode.steps) == 2


def test_an_attempts_key_reaches_its_own_model_only_and_ends_with_it():
    """Two attempts at once through the process's proxy: each key reaches its own attempt's
    endpoint route and no other, a revoked key nothing, and no key nothing."""
    from orchard.agents.external import attempt_proxy, completion

    proxy, endpoint = attempt_proxy(), ModelEndpoint.shared()
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with (
        endpoint.open(lambda body: completion(Reply("from A"), "m")) as a,
        endpoint.open(lambda body: completion(Reply("from B"), "m")) as b,
    ):
        key_a, key_b = proxy.keys.grant("cli", "box-a", route=a), proxy.keys.grant("cli", "box-b", route=b)
        client_a = openai.OpenAI(base_url=proxy.url, api_key=key_a, max_retries=0)
        client_b = openai.OpenAI(base_url=proxy.url, api_key=key_b, max_retries=0)
        assert client_a.chat.completions.create(**ask).choices[0].message.content == "from A"
        assert client_b.chat.completions.create(**ask).choices[0].message.content == "from B"
        # a path naming the other attempt's route is no way there: the key decides
        sneaky = openai.OpenAI(base_url=proxy.url.removesuffix("/v1") + f"/t/{b}/v1", api_key=key_a, max_retries=0)
        assert sneaky.chat.completions.create(**ask).choices[0].message.content == "from A"
        proxy.keys.revoke(key_a)
        with pytest.raises(openai.AuthenticationError):
            client_a.chat.completions.create(**ask)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=proxy.url, api_key="sk-guess", max_retries=0).chat.completions.create(**ask)
        proxy.keys.revoke(key_b)


class _Model:
    """A model session of a real server's kind (it answers side calls too), counting its calls."""

    def __init__(self, fail: Exception | None = None):
        self.calls, self.fail = 0, fail

    def complete(self, messages, tools):
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return Reply("sure", prompt_tokens=1000, completion_tokens=10)


def test_no_call_spends_the_model_past_the_limits_or_after_the_episode():
    """What anything in the sandbox holding the key could try: calls without tools (which no step
    counts) past the limits, and calls once the CLI has exited."""
    harness, model = ClaudeHarness(), _Model()
    episode = Episode("e", _Task(), "claude", "m", [], None, status="completed")  # type: ignore[arg-type]
    turns = _Turns(harness, episode, model, None, Limits(max_tokens=3000), None)  # type: ignore[arg-type]
    side = {"model": "m", "messages": [{"role": "user", "content": "anything"}]}
    answers = [turns.answer(side) for _ in range(10)]
    assert model.calls == 3 and all(a == (400, "the episode has ended: its token limit") for a in answers[4:])
    assert episode.steps == []  # side calls are no steps
    fresh = _Turns(harness, episode, _Model(), None, Limits(), None)  # type: ignore[arg-type]
    fresh.close()
    assert fresh.answer(side)[0] == 400 and fresh.session.calls == 0  # type: ignore[attr-defined]


def test_a_model_that_breaks_ends_the_episode_for_the_cli():
    harness = ClaudeHarness()
    episode = Episode("e", _Task(), "claude", "m", [], None, status="completed")  # type: ignore[arg-type]
    turns = _Turns(harness, episode, _Model(RuntimeError("CUDA out of memory")), None, Limits(), None)  # type: ignore[arg-type]
    ask = {"model": "m", "messages": [{"role": "user", "content": "fix it"}], "tools": [BASH]}
    assert turns.answer(ask) == (400, "the model request failed: RuntimeError: CUDA out of memory")
    assert turns.answer(ask)[0] == 400 and turns.session.calls == 1  # type: ignore[attr-defined]

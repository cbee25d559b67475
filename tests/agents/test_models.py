"""Real models, offline: a tiny model built from a config, run locally with transformers and
served by `transformers serve` (a real OpenAI-compatible server on loopback) to the OpenAI client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from orchard.agents import harness_factory
from orchard.agents.loop import Limits, run_episode
from orchard.agents.models import ModelError, OpenAIModel, TransformersModel, check_model, model_from_spec
from orchard.errors import ConfigError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from orchard.train.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="module")
def example(example_task):
    return example_task("orchard-examples__textkit-2")


def well_formed(episode) -> None:
    roles = [m["role"] for m in episode.messages]
    assert roles[:2] == ["system", "user"] and roles[2] == "assistant"
    assert all(s.prompt_tokens > 0 and s.completion_tokens > 0 for s in episode.steps)
    assert episode.submission == "" and episode.status in ("truncated", "aborted", "completed")


def test_a_tiny_local_model_runs_a_whole_episode(tiny, example, client):
    task, image = example
    model = TransformersModel(str(tiny), max_new_tokens=12)
    harness = harness_factory("bash")()
    with client.create(image) as box:
        episode = run_episode(
            task, harness, model.session(task, harness), box, model_name=model.name, limits=Limits(episode_steps=3)
        )
    well_formed(episode)
    assert len(episode.steps) == 3 and episode.format_errors == 3  # random weights: never a valid block


@pytest.fixture(scope="module")
def served(tiny):
    """`transformers serve` on a free loopback port, with the tiny model preloaded."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tiny.parent / "serve.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "transformers"),
            "serve",
            str(tiny),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (tiny.parent / "serve.log").read_text()[-2000:]
            time.sleep(0.1)
        yield f"{url}/v1", str(tiny)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_the_openai_client_against_a_real_local_server(served, example, client):
    base_url, name = served
    model = OpenAIModel(name, base_url=base_url, max_tokens=12)
    check_model(model)  # the check before a run passes against a real server
    reply = model.complete([{"role": "user", "content": "Say hello."}], None)
    assert isinstance(reply.content, str) and reply.prompt_tokens > 0 and reply.completion_tokens > 0
    task, image = example
    harness = harness_factory("cli")()
    with client.create(image) as box:
        episode = run_episode(
            task, harness, model.session(task, harness), box, model_name=name, limits=Limits(episode_steps=2)
        )
    well_formed(episode)
    assert harness.tools() and len(episode.steps) <= 2


def test_model_specs_and_a_dead_server():
    assert model_from_spec("noop").name == "noop" and model_from_spec("scripted:gold").name == "scripted:gold"
    with pytest.raises(ConfigError, match="unknown model 'gpt'"):
        model_from_spec("gpt")
    with pytest.raises(ConfigError, match=r"no model folder \(or GGUF file\) at /nope"):
        model_from_spec("hf:/nope")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    dead = OpenAIModel("m", base_url=f"http://127.0.0.1:{port}/v1", request_timeout=5)
    with pytest.raises(ModelError, match="the model server failed: APIConnectionError"):
        dead.complete([{"role": "user", "content": "hi"}], None)


def test_a_model_adapter_of_your_own_by_its_import_path():
    assert model_from_spec("orchard.agents.models:ScriptedModel:gold").name == "scripted:gold"
    with pytest.raises(ConfigError, match=r"model 'os:getcwd': os:getcwd has no from_spec"):
        model_from_spec("os:getcwd")
    with pytest.raises(ConfigError, match="unknown model 'gpt:4'"):
        model_from_spec("gpt:4")
    with pytest.raises(ConfigError, match="unknown model 'oracle:gold'"):
        model_from_spec("oracle:gold")

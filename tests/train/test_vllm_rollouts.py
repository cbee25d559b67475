"""RL rollouts that generate on a vLLM server (TRL's server mode), and what `use_vllm` asks of a user.

vLLM itself cannot run here: it needs CUDA, and its wheels pin a torch other than the CPU build
this project installs. So a loopback server stands in for it, speaking the part of vLLM's
OpenAI-compatible protocol that TRL's server mode and Orchard use (`GET /v1/models`, token-id
`POST /v1/completions` with `return_token_ids`) and generating greedily with the tiny model.
TRL's weight push to the server (NCCL) is not exercised.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from orchard.agents.models import ModelError, TransformersModel
from orchard.errors import ConfigError
from orchard.train.config import RLConfig
from orchard.train.rl import SandboxRollouts, VLLMServer, train_rl


@contextmanager
def completions_server(model, *, fail: bool = False) -> Iterator[tuple[str, list[dict]]]:
    import torch

    requests: list[dict] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._answer(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(request)
            if fail or self.path != "/v1/completions":
                return self._answer(500, {"error": "engine dead"})
            (prompt,) = request["prompt"]
            with lock, torch.no_grad():
                output = model.generate(
                    input_ids=torch.tensor([prompt]), max_new_tokens=request["max_tokens"], do_sample=False
                )
            ids = output[0][len(prompt) :].tolist()
            self._answer(200, {"choices": [{"index": 0, "text": "", "token_ids": ids, "prompt_token_ids": prompt}]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchard.train.tiny import build_tiny_model

    folder = build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder), folder


def test_a_rollout_generates_every_turn_on_the_server(client, example_task, orchard_home, tiny):
    from sqlmodel import select
    from trl import GRPOConfig

    from orchard.store import TrajectoryRecord, session

    model, tokenizer, _ = tiny
    task, image = example_task("orchard-examples__textkit-1")
    settings = RLConfig(
        group_size=2,
        max_rollouts=2,
        stride=2,
        harnesses=["bash"],
        episode_steps=3,
        max_new_tokens=12,
        max_completion_length=4096,
        use_vllm=True,
    )
    with completions_server(model) as (url, requests):
        rollouts = SandboxRollouts([task], {task.instance_id: image}, client, settings, run_id="rl-run")
        trainer = SimpleNamespace(
            args=GRPOConfig(output_dir=str(orchard_home / "out"), vllm_server_base_url=url, use_cpu=True)
        )
        server = rollouts._server(trainer)  # the server TRL's config names
        assert server.url == url and server.model == "tiny"
        policy = TransformersModel(model=model, tokenizer=tokenizer, generate=server, max_new_tokens=12)
        rollout = rollouts._rollout(task, policy)
    with session() as db:
        (stored,) = db.exec(select(TrajectoryRecord).where(TrajectoryRecord.run_id == "rl-run"))
    assert len(requests) == stored.steps >= 1  # every turn of the episode was one request
    assert all(r["model"] == "tiny" and r["max_tokens"] == 12 and r["return_token_ids"] for r in requests)
    first = tokenizer.decode(requests[0]["prompt"][0])
    assert first.startswith("<|im_start|>system") and task.problem_statement[:40] in first  # the policy's template
    assert stored.resolved is False and stored.outcome is not None and rollout.reward == settings.failure_reward
    payload = rollout.payload
    assert payload["completion_ids"] and len(payload["env_mask"]) == len(payload["completion_ids"])
    assert 1 in payload["env_mask"] and len(payload["logprobs"]) == len(payload["completion_ids"])


def test_server_failures_are_model_errors_and_a_missing_server_is_one_line(tiny):
    model, _, _ = tiny
    with completions_server(model, fail=True) as (url, requests):
        server = VLLMServer(url, max_new_tokens=4, temperature=1.0)
        with pytest.raises(ModelError, match="500"):  # an aborted rollout, not a crashed run
            server([1, 2, 3])
    assert len(requests) == 1
    with pytest.raises(ConfigError, match=r"no vLLM server at http://127\.0\.0\.1:9 .*trl vllm-serve"):
        VLLMServer("http://127.0.0.1:9/v1", max_new_tokens=4, temperature=1.0)


def test_use_vllm_without_vllm_installed_says_what_to_do(tiny, tmp_path):
    _, _, folder = tiny
    with pytest.raises(ConfigError, match="pip install vllm"):
        train_rl(str(folder), [], {}, None, str(tmp_path / "rl"), RLConfig(use_vllm=True))  # type: ignore[arg-type]

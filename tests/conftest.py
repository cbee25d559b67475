"""Shared fixtures: a real Docker engine (CI fails instead of skipping) and an isolated ORCHARD_HOME."""

from __future__ import annotations

import json
import os
import platform
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchard.store import Store

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# A suite started in the background of a script (`./dev test &`, nohup) inherits SIGINT ignored, and so
# would every process a test starts, which a test's Ctrl-C then never stops: take Python's own back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

pytest_plugins = ["suite_rules"]  # markers from fixtures, and the rule on slow tests


def skip_or_fail(message: str) -> None:
    """Skip locally, but fail in CI: CI must run every test."""
    if IN_CI:
        pytest.fail(f"{message} — CI must run this test, not skip it")
    pytest.skip(message)


def _docker_or_skip():
    """Return a Docker SDK client; without an engine, skip locally but fail in CI."""
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # any way of not reaching the engine
        skip_or_fail(f"no Docker engine reachable ({exc}); start one with `./dev engine`")
    return client


@pytest.fixture(scope="session")
def docker_client():
    """A Docker SDK client for a running engine."""
    client = _docker_or_skip()
    yield client
    client.close()


@pytest.fixture(scope="session")
def root() -> None:
    """The tests run as root (network namespaces, another user); skip locally otherwise, fail in CI."""
    if os.geteuid() != 0:
        skip_or_fail("this test needs root (network namespaces, setpriv)")


@pytest.fixture(scope="session")
def x86_64() -> None:
    """The host is x86-64 (a test speaks its system calls); skip locally otherwise, fail in CI."""
    if platform.machine() != "x86_64":
        skip_or_fail("this test injects x86-64 system calls")


@pytest.fixture(scope="session")
def runsc(docker_client) -> str:
    """The engine's gVisor runtime; without one, skip locally but fail in CI."""
    if "runsc" not in (docker_client.info().get("Runtimes") or {}):
        skip_or_fail("the Docker engine has no runsc runtime; `./dev engine` registers it")
    return "runsc"


EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks"


@pytest.fixture(scope="session")
def example_repos(tmp_path_factory) -> Path:
    """The example tasks' repositories (fixed commits), made once per test process."""
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("example-repos")
    subprocess.run([sys.executable, str(EXAMPLES / "make_repos.py"), str(folder)], check=True, capture_output=True)
    return folder


@pytest.fixture(scope="session")
def example_task(example_repos, base_image):
    """`example_task(instance_id)`: that example task and its image (built offline once)."""
    from orchard.recipes.swe.environments import RepoMirror, task_image
    from orchard.tasks import load_tasks

    mirror = RepoMirror(example_repos)

    def get(instance_id: str):
        task = load_tasks(EXAMPLES / "tasks.jsonl", ids=[instance_id])[0]
        return task, task_image(task, mirror)

    return get


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    """The offline-built Debian base image (python3, git, bash), built once if missing."""
    from orchard.env import images

    return images.build_base()


@pytest.fixture(scope="session")
def busybox_image(docker_client) -> str:
    """A static busybox image: no Python, no libc."""
    from orchard.env import images

    return images.build_busybox()


@pytest.fixture
def orchard_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh ORCHARD_HOME (store, sockets, keys) for one test."""
    home = tmp_path / "orchard-home"
    monkeypatch.setenv("ORCHARD_HOME", str(home))
    monkeypatch.delenv("ORCHARD_DB_URL", raising=False)
    monkeypatch.delenv("ORCHARD_URL", raising=False)
    monkeypatch.delenv("ORCHARD_API_KEY", raising=False)
    yield home


@pytest.fixture(scope="module")
def client(docker_client, base_image, busybox_image, tmp_path_factory) -> Iterator:
    """An embedded SDK client (manager in this process) with its own store, shared by a module."""
    from orchard.env import Client

    db = tmp_path_factory.mktemp("store") / "orchard.db"
    with Client(store=Store.open(f"sqlite:///{db}")) as client:
        yield client


@contextmanager
def running_service(db: Path, backend: Any = "docker", **options) -> Iterator[tuple[str, str]]:
    """A real `orchard up` service (uvicorn on a free loopback port) in a thread, over `backend` (a
    name or a backend config): yields (url, key)."""
    import socket
    import threading
    import time

    import httpx
    import uvicorn

    from orchard.env.manager import SandboxManager
    from orchard.env.service import UVICORN_OPTIONS, Service, create_app

    key = "test-key-" + os.urandom(4).hex()
    manager = SandboxManager(backend, store=Store.open(f"sqlite:///{db}"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(Service(manager, key, **options))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **UVICORN_OPTIONS))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    try:
        yield url, key
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        manager.close()


@pytest.fixture
def start_service(docker_client, base_image):
    """`running_service` itself, for a test that needs a service of its own settings."""
    return running_service


@pytest.fixture(scope="module")
def service(docker_client, base_image, busybox_image, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """A service shared by a module, with small limits so tests can reach them."""
    db = tmp_path_factory.mktemp("service-store") / "orchard.db"
    with running_service(db, max_upload_bytes=2**20, heartbeat_silence=1.5, housekeep_interval=0.5) as running:
        yield running


@pytest.fixture(scope="module")
def default_service(docker_client, base_image, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """A service with the default settings, shared by a module."""
    with running_service(tmp_path_factory.mktemp("service-store") / "orchard.db") as running:
        yield running


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[tuple[list[str], str, Path]]:
    """A real PostgreSQL server on a Unix socket in a temporary folder (no TCP port at all), for the
    session: (the command prefix that runs its tools as their user, its bin folder, its socket folder)."""
    import glob
    import shutil
    import subprocess
    import tempfile

    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins:
        skip_or_fail("PostgreSQL is not installed (apt-get install postgresql); `./dev` installs it")
    folder = Path(tempfile.mkdtemp(prefix="orchard-pg-", dir="/tmp"))  # short, and open to the postgres user
    folder.chmod(0o777)
    as_user = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    data = folder / "data"
    subprocess.run(
        [*as_user, f"{bins[-1]}/initdb", "-A", "trust", "-U", "orchard", "-D", str(data)],
        check=True,
        capture_output=True,
    )
    options = f"-k {folder} -c listen_addresses=''"
    log = str(folder / "server.log")  # the server must not inherit our pipes, or run() waits forever
    subprocess.run(
        [*as_user, f"{bins[-1]}/pg_ctl", "-D", str(data), "-l", log, "-o", options, "-w", "start"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield as_user, bins[-1], folder
    finally:
        subprocess.run([*as_user, f"{bins[-1]}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"], check=False)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of a database of its own on the session's PostgreSQL server: no test sees another's rows,
    whichever ran before it in the same process."""
    import subprocess
    import uuid

    as_user, bins, folder = postgres_server
    name = f"orchard_{uuid.uuid4().hex[:12]}"
    subprocess.run([*as_user, f"{bins}/createdb", "-h", str(folder), "-U", "orchard", name], check=True)
    return f"postgresql+psycopg://orchard@/{name}?host={folder}"


@pytest.fixture
def chat_server() -> Iterator[Callable[[Callable[[list[dict[str, Any]]], str]], tuple[str, list[dict[str, Any]]]]]:
    """A real OpenAI-compatible chat server on loopback, for judges and simulated users played by a
    model: `chat_server(answer)` starts one, `answer(messages)` being each reply's text; returns its
    base URL and the bodies of the requests it gets. Each is stopped, and the model cache of judges
    and users (`orchard.agents.models._ROLES`) cleared, when the test ends."""
    from orchard.agents import models

    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[list[dict[str, Any]]], str]) -> tuple[str, list[dict[str, Any]]]:
        bodies: list[dict[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            def _send(self, data: dict[str, Any]) -> None:
                payload = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                bodies.append(body)
                message = {"role": "assistant", "content": answer(body["messages"])}
                self._send({
                    "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                })  # fmt: skip

            def do_GET(self) -> None:
                self._send({"object": "list", "data": [{"id": "judge-model", "object": "model"}]})

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/v1", bodies

    models._ROLES.clear()
    yield start
    models._ROLES.clear()
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer Llama model with SmolLM2's tokenizer and chat template (a tokenizer llama.cpp's
    converter knows) and random weights spread wide (its replies are not one token over and over),
    for `llama:` models; llama.cpp's server is built first where it is not yet."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orchard.agents.llamacpp import build
    from orchard.train.smollm import smollm2_folder

    build()
    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:  # the matrices; the norms stay at 1
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder

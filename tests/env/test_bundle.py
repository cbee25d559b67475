"""The agent bundle: built from the host's Python, it starts the real agent in any image."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from orchard.env import bundle as bundle_module
from orchard.env.bundle import DEFAULT_AGENT, Bundle, build_bundle, elf_interpreter, sandbox_python
from orchard.env.calls import split_exec_answer
from orchard.errors import ConfigError

MOUNT = "/.orchard"
RUN = "/.orchard-run"


@pytest.fixture(scope="session")
def bundle() -> Bundle:
    """The bundle of the real agent, in the default cache."""
    return build_bundle()


def _host_python(built: Bundle, code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` with the bundled interpreter on the host (the bundle "mounted" where it is)."""
    mount = str(built.path)
    argv = [*built.command(mount)[:-1], "-c", code]
    return subprocess.run(argv, env=built.environment(mount), capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------------


def test_second_build_is_a_cache_hit(bundle: Bundle, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_args, **_kwargs):
        raise AssertionError("the bundle was rebuilt")

    monkeypatch.setattr(bundle_module.subprocess, "run", fail)
    monkeypatch.setattr(bundle_module, "_assemble", fail)
    assert build_bundle() == bundle


def test_layout(bundle: Bundle) -> None:
    files = list(bundle.path.rglob("*"))
    assert not [p for p in files if p.is_symlink()]
    linker = elf_interpreter(Path(sys.executable).resolve())
    assert linker is not None
    assert (bundle.path / "lib" / Path(linker).name).is_file()
    assert bundle.linker == Path(linker).name
    for name in ("bin/python3", "agent/__main__.py", "agent/server.py", "lib/python311.zip", "lib/libc.so.6"):
        assert (bundle.path / name).is_file(), name
    assert list((bundle.path / "lib").glob("libpython3.11.so*"))
    modules = sorted(DEFAULT_AGENT.glob("*.py"))
    assert sorted(p.name for p in (bundle.path / "agent").glob("*.py")) == [p.name for p in modules]
    for module in modules:  # the whole package, as it is
        assert (bundle.path / "agent" / module.name).read_bytes() == module.read_bytes()
    assert bundle.path.parent.name == "agent-bundle"
    assert bundle.size() < 40_000_000


def test_contract(bundle: Bundle) -> None:
    assert bundle.command("/m") == [
        f"/m/lib/{bundle.linker}",
        "--library-path",
        "/m/lib",
        "/m/bin/python3",
        "-s",
        "-S",
        "-B",
        "/m/agent/__main__.py",
    ]
    assert bundle.environment("/m") == {
        "PYTHONHOME": "/m",
        "PYTHONUTF8": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    assert bundle.python("/m") == bundle.command("/m")[:-1]


def test_sandbox_python_is_the_bundles_interpreter_and_its_environment(bundle: Bundle) -> None:
    """The shell words a task starts its programs with, the bundle "mounted" where it is: the
    shell expands the linker's glob, and the words are `Bundle.python` behind its environment."""
    words = sandbox_python(str(bundle.path))
    shown = subprocess.run(
        ["sh", "-c", f"set -- {words}; for word; do echo $word; done"], capture_output=True, text=True, check=True
    )
    env = [f"{name}={value}" for name, value in bundle.environment(str(bundle.path)).items()]
    assert shown.stdout.splitlines() == ["env", *env, *bundle.python(str(bundle.path))]
    code = "import json, sys; print(json.dumps([sys.prefix, sys.flags.utf8_mode, sys.flags.no_site]))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    ran = subprocess.run(["sh", "-c", f"{words} -c '{code}'"], env=clean, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    assert json.loads(ran.stdout) == [str(bundle.path), 1, 1]


SANDBOXED = [
    "orchard/env/sandboxed/httpd.py",
    "orchard/recipes/claw/server.py",
    "orchard/recipes/claw/world.py",
    "orchard/recipes/gui/site.py",
    "examples/gui/sites/*.py",
]
"""Orchard's programs in sandboxes and the modules they load there, which run on the bundle's interpreter."""


def _imported(node: ast.AST) -> list[str]:
    """The modules an import statement names (none for another node, or a relative import)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []


def _sandbox_imports(source: str) -> set[str]:
    """The standard library modules `source` imports where it may run in a sandbox: everywhere but
    in a function that imports Orchard, which only the host has (`load_site`, `parse_log`)."""
    tree = ast.parse(source)
    host_only = set()
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef):
            inside = list(ast.walk(function))
            if any(name.split(".")[0] == "orchard" for node in inside for name in _imported(node)):
                host_only |= {id(node) for node in inside}
    names = {name for node in ast.walk(tree) if id(node) not in host_only for name in _imported(node)}
    return {name for name in names if name.split(".")[0] in sys.stdlib_module_names}


def test_the_bundle_carries_what_the_programs_in_sandboxes_import(bundle: Bundle) -> None:
    root = Path(bundle_module.__file__).parents[2]
    imported = set()
    for pattern in SANDBOXED:
        files = sorted(root.glob(pattern))
        assert files, pattern
        for file in files:
            imported |= _sandbox_imports(file.read_text())
    assert {"datetime", "hashlib", "socketserver", "traceback", "urllib.parse"} <= imported  # lazy ones too
    assert "pathlib" not in imported  # `load_site`'s, on the host
    proc = _host_python(bundle, f"import {', '.join(sorted(imported))}")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_the_agent_package_is_carried_compiled(bundle: Bundle) -> None:
    """A start compiles none of the package but its entry (a script): each module is read from
    its bytecode in `agent/__pycache__`."""
    mount = str(bundle.path)
    code = f"import sys; sys.path.append({mount!r}); import agent.server"  # as the entry imports it
    argv = [*bundle.command(mount)[:-1], "-v", "-c", code]
    proc = subprocess.run(argv, env=bundle.environment(mount), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = [Path(p) for p in re.findall(r"^# code object from '(.+)'$", proc.stderr, re.MULTILINE)]
    ours = sorted(str(p.relative_to(bundle.path)) for p in loaded if p.is_relative_to(bundle.path / "agent"))
    tag = sys.implementation.cache_tag
    modules = [m for m in sorted(DEFAULT_AGENT.glob("*.py")) if m.name != "__main__.py"]
    assert ours == sorted(f"agent/__pycache__/{m.stem}.{tag}.pyc" for m in modules)


def test_interpreter_runs_from_the_bundle_only(bundle: Bundle) -> None:
    code = "import sys, json; print(json.dumps([sys.flags.utf8_mode, sys.prefix, sys.path]))"
    proc = _host_python(bundle, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    utf8, prefix, path = json.loads(proc.stdout)
    assert utf8 == 1
    assert Path(prefix) == bundle.path
    assert all(p == "" or p.startswith(str(bundle.path)) for p in path)


def test_concurrent_builds_share_one_bundle(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from orchard.env.bundle import build_bundle; "
        "print(build_bundle(cache_dir=Path(sys.argv[1])).path)"
    )
    source_root = str(Path(bundle_module.__file__).parents[2])  # importable however pytest runs
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([source_root, os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, "-c", code, str(tmp_path)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    paths = {proc.communicate(timeout=120)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(paths) == 1
    built = Bundle(Path(paths.pop()))
    assert [p.name for p in (tmp_path / "agent-bundle").iterdir()] == [built.path.name]
    proc = _host_python(built, "import json, socket, subprocess; print('ok')")
    assert proc.stdout == "ok\n", proc.stderr


def test_losing_the_race_keeps_the_winner(bundle: Bundle, tmp_path: Path) -> None:
    loser = tmp_path / "loser"
    (loser / "lib").mkdir(parents=True)
    bundle_module._publish(loser, bundle.path)
    assert (bundle.path / "bundle.json").is_file()
    assert loser.is_dir()  # left for its builder to remove


def test_agent_problems_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing"):
        build_bundle(tmp_path / "nope", cache_dir=tmp_path)
    third_party = tmp_path / "agent"
    third_party.mkdir()
    (third_party / "__main__.py").write_text("from . import tools\n")
    (third_party / "tools.py").write_text("import httpx\n")
    with pytest.raises(ConfigError, match="cannot import the agent"):
        build_bundle(third_party, cache_dir=tmp_path)
    assert [p.name for p in (tmp_path / "agent-bundle").iterdir()] == []


# ---------------------------------------------------------------------------------------------
# the real agent in three kinds of images
# ---------------------------------------------------------------------------------------------


@contextmanager
def _running_agent(client, image: str, built: Bundle) -> Iterator[tuple[httpx.Client, str]]:
    """Start the agent from the bundle in `image`; yield an HTTP client on its socket and a token."""
    run_dir = tempfile.mkdtemp(dir="/tmp")
    token = secrets.token_hex(16)
    container = None
    try:
        container = client.containers.run(
            image,
            [*built.command(), "--unix", f"{RUN}/agent.sock", "--workdir", "/workspace"],
            environment={**built.environment(), "ORCHARD_AGENT_TOKEN": token},
            volumes={
                str(built.path): {"bind": MOUNT, "mode": "ro"},
                run_dir: {"bind": RUN, "mode": "rw"},
            },
            network_mode="none",
            init=True,
            detach=True,
        )
        transport = httpx.HTTPTransport(uds=f"{run_dir}/agent.sock")
        with httpx.Client(transport=transport, base_url="http://agent", timeout=10) as http:
            _wait_healthy(http, token, container)
            yield http, token
    finally:
        if container is not None:
            container.remove(force=True)
        shutil.rmtree(run_dir, ignore_errors=True)


def _wait_healthy(http: httpx.Client, token: str, container, limit_s: float = 15) -> None:
    """Poll GET /health until it answers 200; fail with the container's logs otherwise."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if http.get("/health", headers={"Authorization": f"Bearer {token}"}).is_success:
                return
        except httpx.TransportError:
            pass
        container.reload()
        if container.status == "exited":
            break
        time.sleep(0.1)
    pytest.fail(f"agent not healthy: {container.logs().decode(errors='replace')}")


def _assert_runs_agent(client, image: str, built: Bundle) -> None:
    """The agent answers in `image`, and its children do not see the bundle's PYTHONHOME."""
    with _running_agent(client, image, built) as (http, token):
        answer = http.post(
            "/exec",
            json={"command": "echo hi; echo $PYTHONHOME"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 200, answer.text
        assert split_exec_answer(answer.content)[1] == b"hi\n\n"


@pytest.fixture
def poisoned_image(docker_client, base_image: str) -> Iterator[str]:
    """The base image with a python3 that exits 1 and a json package that raises."""
    files = {
        "usr/bin/python3": (b"#!/bin/sh\nexit 1\n", 0o755),
        "usr/lib/python3.11/json/__init__.py": (b"raise ImportError('poisoned')\n", 0o644),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    container = docker_client.containers.create(base_image, ["true"])
    tag = f"poisoned-{uuid.uuid4().hex[:8]}"
    try:
        container.put_archive("/", buffer.getvalue())
        image = container.commit(repository="orchard-test/poisoned", tag=tag)
    finally:
        container.remove(force=True)
    try:
        yield image.id
    finally:
        docker_client.images.remove(image.id, force=True)


def test_agent_in_base_image(docker_client, base_image: str, bundle: Bundle) -> None:
    _assert_runs_agent(docker_client, base_image, bundle)


def test_agent_in_busybox_without_python_or_libc(docker_client, busybox_image: str, bundle: Bundle) -> None:
    _assert_runs_agent(docker_client, busybox_image, bundle)


def test_agent_ignores_the_images_python(docker_client, poisoned_image: str, bundle: Bundle) -> None:
    check = "python3 -c pass; echo $?; python3.11 -c 'import json' 2>&1 | tail -n 1"
    out = docker_client.containers.run(poisoned_image, ["sh", "-c", check], remove=True)
    assert out.decode() == "1\nImportError: poisoned\n"  # the image's Python is truly broken
    _assert_runs_agent(docker_client, poisoned_image, bundle)


def test_interpreter_starts_silently_in_busybox(docker_client, busybox_image: str, bundle: Bundle) -> None:
    code = "import sys, json; print(sys.flags.utf8_mode, json.dumps('é'))"
    out = docker_client.containers.run(
        busybox_image,
        [*bundle.command()[:-1], "-c", code],
        environment=bundle.environment(),
        volumes={str(bundle.path): {"bind": MOUNT, "mode": "ro"}},
        network_mode="none",
        user="65534:65534",  # any user: the bundle is world-readable
        remove=True,
        stderr=True,
    )
    assert out.decode() == '1 "\\u00e9"\n'

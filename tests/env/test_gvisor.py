"""gVisor (`runsc`) as the sandbox runtime: the same agent and API over gVisor's own kernel.

`./dev engine` installs runsc and registers it with the engine, so CI runs these; elsewhere they
skip when the engine has no runsc runtime.
"""

from __future__ import annotations

import platform

import pytest

from orchard.env import Client
from orchard.env.backends import DockerConfig
from orchard.errors import ConfigError
from orchard.store import Store


@pytest.fixture(scope="module")
def gvisor(runsc, base_image, tmp_path_factory):
    db = tmp_path_factory.mktemp("gvisor-store") / "orchard.db"
    with Client(backend=DockerConfig(runtime="runsc"), store=Store.open(f"sqlite:///{db}")) as client:
        yield client


def test_a_sandbox_under_gvisor_runs_on_its_own_kernel(gvisor, base_image):
    with gvisor.create(base_image) as box:
        kernel = box.exec("uname -r").stdout.strip()
        assert kernel and kernel != platform.release()  # gVisor's Sentry answers, not the host
        assert box.exec("echo $((6*7))").stdout == "42\n"
        box.write_file("notes/a.txt", "under gvisor\n")
        assert box.read_file("notes/a.txt") == b"under gvisor\n"
        assert box.exec("cd /tmp && X=1", session="s").exit_code == 0
        assert box.exec("echo $PWD $X", session="s").stdout == "/tmp 1\n"
        with box.terminal(["sh", "-c", "tty; exit 2"]) as term:
            assert b"/dev/pts/" in term.read_until(b"/dev/pts/")
            assert term.wait() == 2
        interfaces = box.exec("python3 -c 'import socket; print(sorted(n for _, n in socket.if_nameindex()))'")
        assert interfaces.stdout == "['lo']\n"


def test_gvisor_refuses_what_its_registration_cannot_give(gvisor, base_image, docker_client):
    with pytest.raises(ConfigError, match="--network=none"):
        gvisor.create(base_image, network="open")
    with pytest.raises(ConfigError, match="no runtime 'kata'"):
        Client(backend=DockerConfig(runtime="kata"))

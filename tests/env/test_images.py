"""The offline-built images: Debian bases (python3, pytest, git, bash; one per release), a static busybox (nothing else)
and the Kubernetes injector (busybox and the agent bundle)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest

from orchard.env import images
from orchard.errors import ConfigError, EngineUnavailable


def _sh(client, image: str, script: str) -> str:
    """Run `sh -c script` in a throwaway container of `image`; return stdout and stderr."""
    out = client.containers.run(image, ["/bin/sh", "-c", script], remove=True, stderr=True, network_mode="none")
    return out.decode()


def _forbid_building(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any rebuild fail loudly, so a returning call proves a cache hit."""

    def fail(*_args, **_kwargs):
        raise AssertionError("the image was rebuilt")

    for name in ("ensure_rootfs", "import_rootfs", "static_busybox"):
        monkeypatch.setattr(images, name, fail)


def test_base_image_has_python_pytest_git_bash(docker_client, base_image: str) -> None:
    out = _sh(
        docker_client, base_image, "python3 --version; python3 -m pytest --version; git --version; bash -c 'echo $BASH'"
    )
    assert "Python 3.11" in out and "pytest 7" in out
    assert "git version" in out
    assert "/bin/bash" in out or "/usr/bin/bash" in out


def test_base_image_config(docker_client, base_image: str) -> None:
    config = docker_client.images.get(base_image).attrs["Config"]
    assert config["Cmd"] == ["/bin/bash"]
    assert "LANG=C.UTF-8" in config["Env"]
    assert config["Labels"]["org.orchard.built-by"] == "orchard"


def test_base_image_labels_its_release_python_and_glibc(docker_client, base_image: str) -> None:
    """Task images pick wheels by these, so they must be what the image really runs."""
    labels = docker_client.images.get(base_image).labels
    assert labels[images.RELEASE_LABEL] == "bookworm"
    facts = images.base_facts(labels)
    script = "python3 -c 'import platform; print(platform.python_version(), platform.libc_ver()[1])'"
    assert facts is not None and _sh(docker_client, base_image, script).split() == list(facts)
    assert images.base_facts({}) is None


def test_the_cli_offers_every_release() -> None:
    """`orchard image build-base --release` spells the releases out (no import of this module at
    `orchard --help`): they must be `RELEASES`."""
    import inspect
    import typing

    from orchard.env import cli

    annotation = inspect.signature(cli.image_build_base, eval_str=True).parameters["release"].annotation
    assert typing.get_args(typing.get_args(annotation)[0]) == tuple(images.RELEASES)


def test_an_unknown_release_is_refused() -> None:
    with pytest.raises(ConfigError, match="no Debian release 'buster': choose one of bullseye, bookworm, trixie"):
        images.build_base(release="buster")


def test_busybox_image_has_no_python_and_no_libc(docker_client, busybox_image: str) -> None:
    script = "ls -d /lib* /usr/lib* 2>/dev/null; which python3 || echo no-python; echo ok"
    assert _sh(docker_client, busybox_image, script) == "no-python\nok\n"
    assert _sh(docker_client, busybox_image, "test -d /tmp -a -d /root && whoami") == "root\n"


def test_second_build_is_a_cache_hit(
    docker_client, base_image: str, busybox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = {tag: docker_client.images.get(tag).id for tag in (base_image, busybox_image)}
    _forbid_building(monkeypatch)
    assert images.build_base() == base_image
    assert images.build_busybox() == busybox_image
    assert images.image_exists(base_image)
    assert {tag: docker_client.images.get(tag).id for tag in ids} == ids


def test_rebuild_without_root_says_what_to_do(docker_client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path))  # no finished root filesystem
    monkeypatch.setattr(images.os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="root"):
        images.build_base("orchard-test/never:built", force=True)


def test_unreachable_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(EngineUnavailable, match="Docker engine"):
        images.image_exists("orchard/base:bookworm")


def test_static_busybox_is_checked(tmp_path: Path) -> None:
    assert images.static_busybox() == images.BUSYBOX
    with pytest.raises(ConfigError, match="busybox-static"):
        images.static_busybox(tmp_path / "busybox")
    with pytest.raises(ConfigError, match="busybox-static"):
        images.static_busybox(Path(sys.executable).resolve())  # dynamically linked


def test_find_mirror_reads_both_formats(tmp_path: Path) -> None:
    one_line = tmp_path / "one"
    (one_line / "sources.list.d").mkdir(parents=True)
    (one_line / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb [signed-by=/k.gpg] http://security.example/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://mirror.example/debian/ bookworm main contrib\n"
    )
    assert images.find_mirror([one_line]) == "http://mirror.example/debian"

    deb822 = tmp_path / "deb822"
    (deb822 / "sources.list.d").mkdir(parents=True)
    (deb822 / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\n# a comment\nURIs: http://822.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    (deb822 / "sources.list.d" / "other.list.disabled").write_text("deb http://ignored.example/debian bookworm main\n")
    assert images.find_mirror([deb822]) == "http://822.example/debian"
    assert images.find_mirror([tmp_path / "missing"]) == images.DEFAULT_MIRROR


# -- the Kubernetes injector image --------------------------------------------------------------


def _agent_answering(url: str, token: str, deadline_s: float = 30.0) -> dict:
    """The agent's `/health` answer at `url`, waiting until it listens."""
    import time

    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    stop = time.monotonic() + deadline_s
    while True:
        try:
            return httpx.get(f"{url}/health", headers=headers, timeout=2).raise_for_status().json()
        except httpx.TransportError:
            if time.monotonic() > stop:
                raise
            time.sleep(0.2)


def test_agent_image_injects_the_agent_into_an_image_without_python(docker_client, busybox_image: str) -> None:
    """As a Pod does: the injector copies the bundle into a volume, and a container of an image
    with no Python and no libc starts the agent from that volume (read-only) over TCP."""
    import httpx

    from orchard.env.bundle import build_bundle

    tag = images.build_agent()
    bundle = build_bundle()
    config = docker_client.images.get(tag).attrs["Config"]
    assert config["Labels"][images.AGENT_BUNDLE_LABEL] == bundle.path.name
    assert config["Cmd"] == images.INJECT_COMMAND
    volume = docker_client.volumes.create()
    sandbox = None
    try:
        mounts = {volume.name: {"bind": "/.orchard", "mode": "rw"}}
        docker_client.containers.run(tag, images.INJECT_COMMAND, volumes=mounts, remove=True, network_mode="none")
        token = "injected-token"
        sandbox = docker_client.containers.run(
            busybox_image,
            [*bundle.command("/.orchard"), "--tcp", "0.0.0.0:7000", "--workdir", "/tmp"],
            environment={**bundle.environment("/.orchard"), "ORCHARD_AGENT_TOKEN": token},
            volumes={volume.name: {"bind": "/.orchard", "mode": "ro"}},
            ports={"7000/tcp": ("127.0.0.1", None)},
            detach=True,
        )
        sandbox.reload()
        port = sandbox.attrs["NetworkSettings"]["Ports"]["7000/tcp"][0]["HostPort"]
        url = f"http://127.0.0.1:{port}"
        assert _agent_answering(url, token)["status"] == "ok"
        ran = httpx.post(
            f"{url}/exec",
            json={"command": "echo injected; ls /bin/python3 || true"},
            headers={"Authorization": f"Bearer {token}"},
        )
        head, _, body = ran.content.partition(b"\n")
        assert ran.status_code == 200 and json.loads(head)["exit_code"] == 0
        assert body.startswith(b"injected\n")  # and the image itself still has no python3
        assert httpx.get(f"{url}/health", headers={"Authorization": "Bearer wrong"}).status_code == 403
    finally:
        if sandbox is not None:
            sandbox.remove(force=True)
        volume.remove(force=True)


def test_agent_image_is_rebuilt_only_for_another_bundle(
    docker_client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchard.env.bundle import Bundle

    tag = images.build_agent()
    image_id = docker_client.images.get(tag).id
    _forbid_building(monkeypatch)
    assert images.build_agent() == tag and docker_client.images.get(tag).id == image_id
    with pytest.raises(AssertionError, match="rebuilt"):
        images.build_agent(bundle=Bundle(tmp_path / "another-bundle-hash"))
    with pytest.raises(AssertionError, match="rebuilt"):
        images.build_agent(force=True)


def test_image_build_agent_command(docker_client) -> None:
    from typer.testing import CliRunner

    from orchard.cli import app

    tag = "orchard-test/agent:cli"
    try:
        result = CliRunner().invoke(app, ["image", "build-agent", "--tag", tag, "--force"])
        assert result.exit_code == 0, result.output
        assert result.stdout == f"{tag}\n"
        assert docker_client.images.get(tag).labels[images.AGENT_FORMAT_LABEL] == images.AGENT_FORMAT
    finally:
        with contextlib.suppress(Exception):
            docker_client.images.remove(tag)

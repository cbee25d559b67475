"""The service image (`orchard image build-service`, `orchard.deploy`): what it installs of Orchard's
declared dependencies and what it leaves out, that the left-out ones really are absent while
`orchard` runs as uid 10001, that an unchanged wheel is a cache hit, and that an installed Orchard
is told to pass a wheel. tests/kube/test_service_pod.py runs it as the Deployment's Pod."""

from __future__ import annotations

import tomllib
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from typer.testing import CliRunner

from orchard import deploy
from orchard.cli import app
from orchard.env import images
from orchard.errors import ConfigError
from orchard.tasks import wheelhouse
from orchard.tasks.wheelhouse import Target, Wheel

ROOT = Path(__file__).resolve().parents[2]


def _wheel(folder: Path, requires: list[str], extras: list[str], name: str = "orchard-agents") -> Path:
    """A wheel holding only metadata, as `pip wheel` writes it."""
    lines = ["Metadata-Version: 2.4", f"Name: {name}", "Version: 0.1.0", "Requires-Python: >=3.11"]
    lines += [f"Provides-Extra: {extra}" for extra in extras] + [f"Requires-Dist: {line}" for line in requires]
    path = folder / f"{name.replace('-', '_')}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-0.1.0.dist-info/METADATA", "\n".join(lines) + "\n")
    return path


def test_the_image_installs_the_declared_dependencies_less_the_training_ones(tmp_path: Path) -> None:
    requires = [
        "fastapi<0.200,>=0.160",
        "torch<2.16,>=2.13",
        "Transformers<6,>=5",
        "swebench==4.1.0",
        "pip<27,>=26",
        'kubernetes<38,>=37; extra == "kubernetes"',
        'psycopg[binary]<4,>=3.2; extra == "postgres"',
        'peft<0.22,>=0.18; extra == "lora"',
    ]
    wheel = deploy.OrchardWheel.read(_wheel(tmp_path, requires, ["kubernetes", "lora", "postgres"]))
    project = deploy.service_project(wheel)
    assert project.requires_dist == (
        "fastapi<0.200,>=0.160",
        "pip<27,>=26",
        'kubernetes<38,>=37; extra == "kubernetes"',
        'psycopg[binary]<4,>=3.2; extra == "postgres"',
        'peft<0.22,>=0.18; extra == "lora"',  # kept, and not installed: `lora` is not an extra it asks for
    )
    assert project.extras == ("kubernetes", "postgres") and project.name == "orchard-agents"


def test_a_wheel_that_is_not_orchard_or_lacks_an_extra_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a wheel of Orchard"):
        deploy.OrchardWheel.read(_wheel(tmp_path, [], ["kubernetes", "postgres"], name="other-thing"))
    wheel = deploy.OrchardWheel.read(_wheel(tmp_path, [], ["kubernetes"]))
    with pytest.raises(ConfigError, match="has no extra 'postgres'"):
        deploy.service_project(wheel)
    (tmp_path / "broken.whl").write_text("not a zip")
    with pytest.raises(ConfigError, match="is not a readable wheel"):
        deploy.OrchardWheel.read(tmp_path / "broken.whl")


def test_every_exclusion_is_a_dependency_orchard_declares() -> None:
    """The list cannot rot: each left-out name is one pyproject.toml still declares, and the extras exist."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {canonicalize_name(Requirement(line).name) for line in project["dependencies"]}
    assert set(deploy.NOT_IN_SERVICE) <= declared
    assert set(deploy.SERVICE_EXTRAS) <= set(project["optional-dependencies"])


def test_a_resolution_that_pulls_an_excluded_one_back_in_is_refused_and_one_that_does_not_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path / "cache"))
    project = deploy.service_project(
        deploy.OrchardWheel.read(_wheel(tmp_path, ["fastapi"], ["kubernetes", "postgres"]))
    )
    fastapi = Wheel("fastapi", "0.165.0", "https://files.example/fastapi-0.165.0-py3-none-any.whl", "ab" * 32)
    torch = Wheel("torch", "2.13.0", "https://files.example/torch-2.13.0-cp311-cp311-linux_x86_64.whl", "cd" * 32)
    asked: list[object] = []

    def house(answer: list[Wheel]) -> SimpleNamespace:
        return SimpleNamespace(target=Target("3.11.2", "2.36"), resolve=lambda *a, **k: asked.append(a) or answer)

    with pytest.raises(ConfigError, match="leaves out torch, but another of Orchard's dependencies requires it"):
        deploy.resolve_service(house([fastapi, torch]), project)  # type: ignore[arg-type]
    assert deploy.resolve_service(house([fastapi]), project, fresh=True) == [fastapi]  # type: ignore[arg-type]
    assert len(asked) == 2
    assert deploy.resolve_service(house([]), project) == [fastapi]  # type: ignore[arg-type]
    assert len(asked) == 2  # the kept resolution: no index asked


def test_an_installed_orchard_is_told_to_pass_a_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deploy, "checkout", lambda: None)
    result = CliRunner().invoke(app, ["image", "build-service"])
    assert result.exit_code == 1
    assert "installed, not a source checkout: pass --wheel PATH" in result.output
    result = CliRunner().invoke(app, ["image", "build-service", "--wheel", "/nonexistent.whl"])
    assert result.exit_code == 1 and "no wheel /nonexistent.whl" in result.output


def test_the_deployment_names_the_images_these_commands_build() -> None:
    """deploy/kubernetes/deployment.yaml runs `orchard image build-service`'s tag, and passes
    `orchard image build-agent`'s as the injector: a version bump must move both."""
    deployment = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == deploy.service_tag()
    assert container["args"][container["args"].index("--agent-image") + 1] == images.agent_tag()
    security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert security["runAsUser"] == security["runAsGroup"] == deploy.SERVICE_USER


# -- the image itself -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(docker_client, tmp_path_factory) -> tuple[str, Path]:
    """The service image of this checkout's wheel (built once; reused while the wheel is the same)."""
    wheel = deploy.build_wheel(tmp_path_factory.mktemp("wheel"))
    return deploy.build_service(wheel=wheel), wheel


def test_the_image_runs_orchard_as_uid_10001_without_the_training_libraries(docker_client, built) -> None:
    tag, _ = built
    config = docker_client.images.get(tag).attrs["Config"]
    assert config["User"] == "10001:10001" and config["Entrypoint"] == ["orchard"]
    assert "Usage: orchard" in docker_client.containers.run(tag, ["--help"], remove=True, network_mode="none").decode()
    excluded = " ".join(deploy.NOT_IN_SERVICE)
    script = (
        "id -u; for m in " + excluded.replace("-", "_") + "; do "
        'python -c "import $m" 2>/dev/null && echo "installed: $m"; done; '
        "python -c 'import orchard.env.service, orchard.env.backends.kubernetes, kubernetes, psycopg; print(\"ok\")'"
    )
    out = docker_client.containers.run(tag, ["-c", script], entrypoint="sh", remove=True, network_mode="none")
    assert out.decode().split() == ["10001", "ok"]


def test_an_unchanged_wheel_is_a_cache_hit(docker_client, built, monkeypatch: pytest.MonkeyPatch) -> None:
    tag, wheel = built

    def fail(*_args, **_kwargs):
        raise AssertionError("the image was rebuilt")

    monkeypatch.setattr(deploy, "resolve_service", fail)
    monkeypatch.setattr(wheelhouse, "docker_build", fail)
    assert deploy.build_service(wheel=wheel) == tag
    labels = docker_client.images.get(tag).labels
    assert labels[deploy.SERVICE_WHEEL_LABEL] == deploy.OrchardWheel.read(wheel).digest

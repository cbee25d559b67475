"""What a lab deploys: the service's image, `orchard/orchard:<version>`, built offline from Orchard's wheel.

`build_service()` (`orchard image build-service`) makes the image `deploy/kubernetes/deployment.yaml`
runs: the bookworm base image (`orchard.env.images.build_base`, Python 3.11) with a venv at
`/opt/orchard/venv` holding Orchard's wheel and what the service needs, `orchard` its entrypoint,
run as the unprivileged user 10001 (the Deployment's `runAsUser`).

* **The wheel** is this checkout's (`pip wheel --no-deps --no-build-isolation` of a copy of its
  sources, a few seconds), or the file `wheel=` names. An Orchard installed from a wheel has no
  sources to build one from: it needs `wheel=`.
* **What it installs**: the wheel with `--no-deps`, and what the wheel's own `Requires-Dist`
  declares with the extras `SERVICE_EXTRAS` (the Kubernetes client, psycopg), less
  `NOT_IN_SERVICE`: the training and evaluation libraries the service never imports (torch and
  its kin are gigabytes). The rest is read from the wheel, so a dependency added to pyproject.toml
  reaches the image by itself; a resolution that pulls an excluded one back in through another
  dependency is refused, naming it.
* **Offline**: the host's pip resolves for the base image's Python and glibc and the files come
  from the shared wheel cache (`orchard.tasks.wheelhouse`: the host's package index is used only
  to download); `docker build` runs with no network and installs with `pip --no-index` from that
  wheelhouse alone. The wheelhouse stays in a build stage: the image holds the venv, not the wheels.
* **Cached**: the image is labelled with the wheel's content hash (`SERVICE_WHEEL_LABEL`) and with
  what else it is built from (`SERVICE_RECIPE_LABEL`: the base image, the extras, the exclusions,
  the layout); a build that finds both labels unchanged returns at once. The resolution is kept
  per requirement set under `settings().cache_dir / "service"`, so a rebuild for a changed wheel
  with the same dependencies asks no index, and the engine's build cache keeps the installed
  dependencies (`force=True` resolves again and rebuilds).

The engine is reached with `docker.from_env()`: an unreachable engine raises `EngineUnavailable`.
deploy/kubernetes/README.md says how to load the image into a cluster.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import canonicalize_name

from orchard import __version__
from orchard.config import settings
from orchard.env import images
from orchard.errors import ConfigError

if TYPE_CHECKING:
    from orchard.tasks.wheelhouse import Project, Wheel, Wheelhouse

Log = Callable[[str], None]

DISTRIBUTION = "orchard-agents"
"""Orchard's distribution name (the import package and the command stay `orchard`)."""
SERVICE_EXTRAS = ("kubernetes", "postgres")
"""The wheel's extras the service needs: the Kubernetes backend's client and the PostgreSQL driver
of a fleet's shared store."""
NOT_IN_SERVICE: dict[str, str] = {
    "torch": "training (`orchard train`) and the models it loads",
    "transformers": "training, and models run in-process",
    "trl": "training: the SFT and RL trainers",
    "accelerate": "training",
    "datasets": "training data and SWE-bench's dataset loader",
    "swebench": "SWE-bench's specs and log parsers (evaluating its tasks); it requires datasets",
    "matplotlib": "the reports' charts (numpy comes with it)",
}
"""Orchard's declared dependencies the service image leaves out, and what needs each instead.
`orchard up` imports none of them (Orchard imports heavy libraries inside the commands that use
them); together with what they pull in they are gigabytes."""
SERVICE_USER = 10001
"""The uid and gid the image runs as: the Deployment's `runAsUser` and `runAsGroup`."""
VENV = "/opt/orchard/venv"
SERVICE_HOME = "/var/lib/orchard"
"""The user's home: where the Deployment mounts the service's state (an emptyDir)."""
SERVICE_WHEEL_LABEL = "org.orchard.service-wheel"
"""The content hash of the wheel the image holds (`OrchardWheel.digest`)."""
SERVICE_RECIPE_LABEL = "org.orchard.service-recipe"
"""A hash of the rest the image is built from (`_recipe`)."""
STAGE_LABEL = "org.orchard.service-stage"
"""Marks the build stage (the wheelhouse and the venv being installed), an untagged image the
engine keeps as its build cache; older ones are removed after each build."""
SERVICE_FORMAT = "1"
"""Bump when the image's layout changes, so older images are rebuilt."""
SOURCES = ("orchard", "examples", "setup.py", "pyproject.toml", "README.md")
"""What of a checkout the wheel is built from."""


def service_tag(version: str = __version__) -> str:
    """The tag of the service image: `orchard/orchard:<version>`, what deployment.yaml names."""
    return f"orchard/orchard:{version}"


# ---------------------------------------------------------------------------------------------
# the wheel
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrchardWheel:
    """A wheel of Orchard and what its metadata declares."""

    path: Path
    version: str
    requires_dist: tuple[str, ...]
    requires_python: str | None
    provides_extra: tuple[str, ...]
    digest: str
    """A hash of the files it holds (names and contents, not the archive's timestamps): the same
    sources give the same digest whenever they are built."""

    @classmethod
    def read(cls, path: Path) -> OrchardWheel:
        """The wheel at `path`; ConfigError when it is not a readable wheel of Orchard."""
        digest = hashlib.sha256()
        try:
            with zipfile.ZipFile(path) as archive:
                names = sorted(archive.namelist())
                for name in names:
                    digest.update(name.encode() + b"\0" + hashlib.sha256(archive.read(name)).digest())
                found = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
                text = archive.read(found[0]).decode() if len(found) == 1 else ""
        except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} is not a readable wheel: {exc}") from None
        metadata = email.parser.Parser().parsestr(text)
        if canonicalize_name(metadata.get("Name") or "") != DISTRIBUTION:
            raise ConfigError(f"{path} is not a wheel of Orchard ({DISTRIBUTION}): give the one `pip wheel` built")
        return cls(
            path=path,
            version=str(metadata["Version"]),
            requires_dist=tuple(metadata.get_all("Requires-Dist") or ()),
            requires_python=metadata.get("Requires-Python"),
            provides_extra=tuple(metadata.get_all("Provides-Extra") or ()),
            digest=digest.hexdigest()[:16],
        )


def checkout() -> Path | None:
    """The source checkout this Orchard runs from, or None for an installed wheel."""
    root = Path(__file__).resolve().parents[1]
    return root if all((root / name).exists() for name in SOURCES) else None


def build_wheel(folder: Path, source: Path | None = None) -> Path:
    """Build Orchard's wheel from a copy of the checkout `source` (default: this one) into `folder`
    (the checkout itself is not written to); return its path."""
    from orchard.tasks.wheelhouse import reason

    root = source or checkout()
    if root is None:
        raise ConfigError(
            f"the service image is built from Orchard's wheel, and this Orchard ({Path(__file__).parent}) is "
            f"installed, not a source checkout: pass --wheel PATH (`pip wheel --no-deps .` in a checkout of "
            f"Orchard {__version__} makes one)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="orchard-wheel-") as tmp:
        copy = Path(tmp) / "source"
        skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for name in SOURCES:
            if (root / name).is_dir():
                shutil.copytree(root / name, copy / name, ignore=skip)
            else:
                shutil.copy2(root / name, copy / name)
        argv = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "wheel", "--no-deps"]
        argv += ["--no-build-isolation", "--quiet", "--wheel-dir", str(folder), str(copy)]
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", check=False)
    if done.returncode != 0:
        raise ConfigError(
            f"building Orchard's wheel from {root} failed: {reason(done.stdout + done.stderr)} "
            "(it needs setuptools>=77 beside Orchard: the `dev` extra has it)"
        )
    (built,) = folder.glob("orchard_agents-*.whl")
    return built


# ---------------------------------------------------------------------------------------------
# what the image installs
# ---------------------------------------------------------------------------------------------


def service_project(wheel: OrchardWheel) -> Project:
    """What the image installs besides the wheel, as a project to resolve: the wheel's declared
    dependencies with `SERVICE_EXTRAS`, less `NOT_IN_SERVICE`."""
    from orchard.tasks.wheelhouse import Project, vetted

    what = f"the dependencies of {wheel.path.name}"
    lacking = [extra for extra in SERVICE_EXTRAS if extra not in wheel.provides_extra]
    if lacking:
        raise ConfigError(f"{wheel.path.name} has no extra {lacking[0]!r}: it is not a wheel the service image takes")
    kept = tuple(
        line for line in wheel.requires_dist if canonicalize_name(vetted(line, what).name) not in NOT_IN_SERVICE
    )
    return Project(DISTRIBUTION, wheel.version, kept, wheel.requires_python, wheel.provides_extra, SERVICE_EXTRAS)


def resolve_service(house: Wheelhouse, project: Project, *, fresh: bool = False) -> list[Wheel]:
    """The distributions `project` resolves to for `house`'s interpreter, kept per requirement set
    under `settings().cache_dir / "service"` (asked of the index again with `fresh`); ConfigError
    when one of `NOT_IN_SERVICE` is among them."""
    from orchard.tasks.wheelhouse import Wheel

    asked = {
        "requires_dist": sorted(project.requires_dist),
        "requires_python": project.requires_python,
        "extras": sorted(project.extras),
        "target": asdict(house.target),
    }
    key = hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:16]
    kept = settings().cache_dir / "service" / f"resolution-{key}.json"
    wheels: list[Wheel] | None = None
    if not fresh:
        with suppress(OSError, ValueError, TypeError, KeyError):
            wheels = [Wheel(**item) for item in json.loads(kept.read_text())["wheels"]]
    if wheels is None:
        wheels = house.resolve([], what="the service image", project=project)
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(f".{kept.name}.{os.getpid()}")
        partial.write_text(json.dumps({"asked": asked, "wheels": [asdict(wheel) for wheel in wheels]}, indent=1))
        os.replace(partial, kept)
    pulled = sorted(wheel.name for wheel in wheels if canonicalize_name(wheel.name) in NOT_IN_SERVICE)
    if pulled:
        raise ConfigError(
            f"the service image leaves out {', '.join(pulled)}, but another of Orchard's dependencies requires it: "
            "drop that dependency from the image too (NOT_IN_SERVICE in orchard/deploy.py)"
        )
    return wheels


def _recipe(base_id: str) -> str:
    """A hash of what the image is built from besides the wheel."""
    parts = [SERVICE_FORMAT, base_id, ",".join(SERVICE_EXTRAS), ",".join(sorted(NOT_IN_SERVICE)), str(SERVICE_USER)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def dockerfile(base: str, pip: Wheel, wheels: list[Wheel], orchard_wheel: str) -> str:
    """Two stages: the dependencies installed into the venv from the wheelhouse (`wheels/`), then
    the base image with the service's user, that venv, and Orchard's wheel (`orchard/`) installed
    into it last, so a changed wheel rebuilds only its own layers."""
    pins = " ".join(f"{wheel.name}=={wheel.version}" for wheel in wheels)
    user, pip_options = SERVICE_USER, "--quiet --no-index --no-cache-dir --disable-pip-version-check"
    return (
        f"FROM {base} AS build\n"
        f"LABEL {STAGE_LABEL}=build\n"
        "COPY wheels /wheels\n"
        f"RUN /usr/bin/python3 -m venv --without-pip {VENV} && "
        f"{VENV}/bin/python /wheels/{pip.filename}/pip install {pip_options} --find-links /wheels {pins}\n"
        f"FROM {base}\n"
        f"RUN echo 'orchard:x:{user}:{user}:Orchard service:{SERVICE_HOME}:/usr/sbin/nologin' >> /etc/passwd && "
        f"echo 'orchard:x:{user}:' >> /etc/group && mkdir -p {SERVICE_HOME} && chown {user}:{user} {SERVICE_HOME}\n"
        f"COPY --from=build {VENV} {VENV}\n"
        "COPY orchard /tmp/orchard\n"
        f"RUN {VENV}/bin/python -m pip install {pip_options} --no-deps /tmp/orchard/{orchard_wheel} && rm -r /tmp/orchard\n"
        f"ENV PATH={VENV}/bin:{images.SEARCH_PATH} VIRTUAL_ENV={VENV} HOME={SERVICE_HOME} PYTHONUNBUFFERED=1\n"
        f"WORKDIR {SERVICE_HOME}\n"
        f"USER {user}:{user}\n"
        'ENTRYPOINT ["orchard"]\n'
        'CMD ["--help"]\n'
    )


# ---------------------------------------------------------------------------------------------
# the image
# ---------------------------------------------------------------------------------------------


def build_service(
    tag: str | None = None, *, wheel: Path | None = None, force: bool = False, log: Log | None = None
) -> str:
    """Build (or reuse) the service image of `wheel` (default: this checkout's, `build_wheel`);
    return its tag, `service_tag(<the wheel's version>)` unless `tag` is given.

    An image already tagged so, labelled with the same wheel digest and recipe, is reused unless
    `force=True`. Builds the base image first when it is missing (`build_base`: root and
    debootstrap).
    """
    import docker.errors

    from orchard.tasks.wheelhouse import Target, Wheelhouse, docker_build, fetch, reason

    say = log or images.quiet
    with tempfile.TemporaryDirectory(prefix="orchard-service-image-") as tmp:
        context = Path(tmp)
        if wheel is None:
            path = build_wheel(context / "orchard")
        else:
            if not Path(wheel).is_file():
                raise ConfigError(f"no wheel {wheel}")
            (context / "orchard").mkdir()
            path = Path(shutil.copy2(wheel, context / "orchard" / Path(wheel).name))
        facts = OrchardWheel.read(path)
        tag = tag or service_tag(facts.version)
        base = images.build_base(log=say)
        with closing(images.docker_client()) as client, images.build_lock(tag):
            base_image = client.images.get(base)
            labels = {SERVICE_WHEEL_LABEL: facts.digest, SERVICE_RECIPE_LABEL: _recipe(str(base_image.id))}
            previous = _labelled(client, tag)
            if not force and previous is not None and all(previous[1].get(k) == v for k, v in labels.items()):
                return tag
            target = images.base_facts(dict(base_image.labels or {}))
            if target is None:
                raise ConfigError(f"base image {base} does not say its Python and glibc: rebuild it with --force")
            house = Wheelhouse(client, base, Target(*target), say)
            wheels = resolve_service(house, service_project(facts), fresh=force)
            pip = next((w for w in wheels if canonicalize_name(w.name) == "pip"), None)
            if pip is None:
                raise ConfigError(f"{path.name} does not require pip: the image's venv has no installer")
            fetch(wheels, context / "wheels", house.target, log=say)
            (context / "Dockerfile").write_text(dockerfile(base, pip, wheels, path.name))

            def failed(error: str, output: str) -> Exception:
                return ConfigError(f"building {tag} failed: {reason(output) or error.strip()}")

            say(f"building {tag} from {base}: {path.name} and {len(wheels)} distributions, with no network")
            built = {images.LABEL.partition("=")[0]: images.LABEL.partition("=")[2], **labels}
            docker_build(client, context, tag, failed, labels=built)
            _remove_leftovers(client, previous[0] if previous else None, tag)
            with suppress(docker.errors.APIError):
                say(f"built {tag}: {client.images.get(tag).attrs['Size'] / 1e6:.0f} MB")
    return tag


def _labelled(client: Any, tag: str) -> tuple[str, dict[str, str]] | None:
    """(id, labels) of image `tag`, or None when the engine has none by that name."""
    import docker.errors

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return str(image.id), dict(image.labels or {})


def _remove_leftovers(client: Any, previous: str | None, tag: str) -> None:
    """Remove the image `tag` named before this build and every build stage but the newest (the
    engine's cache of the installed dependencies); one still in use stays."""
    import docker.errors

    stages = client.images.list(filters={"dangling": True, "label": f"{STAGE_LABEL}=build"})
    stale = sorted(stages, key=lambda image: image.attrs.get("Created", ""))[:-1]
    current = client.images.get(tag).id
    for image_id in [*([previous] if previous and previous != current else []), *(s.id for s in stale)]:
        with suppress(docker.errors.APIError):
            client.images.remove(image_id)

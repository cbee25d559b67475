"""Task images, built offline: a base image with the task's Python, its dependencies from a
wheelhouse, and the repository at `base_commit`.

What an image holds is the task's `Environment` (`SWETask.environment()`: SWE-bench's spec, the
row's fields on top), made as SWE-bench's harness makes it, offline. The repository comes from a
`RepoMirror` (`orchard.tasks.repos`); dependencies are resolved on the host into a wheelhouse
(`orchard.tasks.wheelhouse`), where nothing the repository names runs.

* **Python.** The base image is the Debian release that ships the Python the task asks for
  (`orchard.env.images.RELEASES`: 3.9 bullseye, 3.11 bookworm, 3.13 trixie; `orchard image
  build-base --release R`). A Python none of them offers runs on the nearest (a tie goes to the
  older one), with a warning in the build log and on the image (`image_warnings`), and with the
  edits of its standard library that make it report what the asked-for Python reports where a
  row's test names depend on it (`DIFFERENCES`). A task without a Python gets bookworm, as
  before; a missing base image is an error naming the command that builds it.
* **Dependencies.** The requirements file read from the mirror at `environment_setup_commit` (at
  `base_commit`, with a warning, where the mirror lacks that commit), its `-r` includes merged one
  level as SWE-bench does; the spec's (conda) `packages` and its `environment.yml`, installed with
  pip under the same names (`conda_requirement`); its `pip_packages`; pip, setuptools and wheel;
  the build backend the repository's `pyproject.toml` names; and the repository's own
  dependencies (with the extras `install` names), read from its metadata by pip in a first image
  stage, with no network there, and resolved under what that stage has installed. A line of a
  requirements file or an environment file that is not a plain requirement (a direct reference,
  an option) or that does not build here (it needs a C compiler) is left out with a warning, and
  so is a conda package with no distribution at all; anything else missing is one error naming
  the package.
* **The image.** `docker build` with no network: a venv at `VENV` first on PATH (so `python`,
  `pip` and `pytest` are the task's, for the agent's shell and the grader alike), the wheelhouse at
  `WHEELHOUSE` with `PIP_NO_INDEX=1` and `PIP_FIND_LINKS` (so the grader's re-run of `install` is
  offline too), then requirements, packages and pip packages in SWE-bench's order, the
  repository (`repos.checkout`: nothing newer than `base_commit`), `pre_install` (lines that need
  the network, `apt-get ...`, skipped; lines that fail, recorded; the build goes on) and `install`.
  A later step wins as it does there: the repository's install replaces what an earlier step
  installed and its own requirements exclude (`superseded`). What a spec installs is resolved as
  of `specs.RESOLVED_BEFORE`; a step that fails is named in the error. How long each part of a
  build took is kept (`build_seconds`) for the run's report.

Tasks without a spec and with nothing to install (the example tasks) get the image they always
had: the base, the checkout, their own `install`. The tag is a hash of what the image is made of
(`FORMAT`, the base, the repository, its commits, the commit its environment files were read at,
the version and the environment less its grading fields), so tasks sharing them share one image
and a second build is a no-op; what a build read and warned about is in its labels
(`org.orchard.task.*`).

`task_image(..., source="swebench")` (`orchard eval --image-source swebench`) builds nothing: it
takes SWE-bench's published instance image (`swebench_image_name`: the repository at `/testbed`,
the `testbed` conda env that `specs.CONDA_ACTIVATE` turns on) from the engine, or pulls it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import platform
import re
import secrets
import shlex
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from orchard.config import settings
from orchard.env import images
from orchard.errors import ConfigError, ImageNotFound, SandboxError
from orchard.recipes.swe.specs import RESOLVED_BEFORE, Environment, swebench_module
from orchard.recipes.swe.task import SWETask
from orchard.tasks import repos
from orchard.tasks.repos import RepoMirror, lock_for
from orchard.tasks.wheelhouse import (
    NAME,
    STEP,
    TOOLS,
    MissingWheel,
    Project,
    SourceBuildFailed,
    Target,
    Wheel,
    Wheelhouse,
    build_system_requires,
    docker_build,
    fetch,
    plain,
    quiet,
    reason,
    split_vetted,
    venv_bootstrap,
)

Log = Callable[[str], None]

FORMAT = 5
"""Bump when the image recipe changes, so older images are not reused."""
LABEL_PREFIX = "org.orchard.task."
WARNINGS_LABEL = LABEL_PREFIX + "warnings"
"""A JSON list of what the image is not as the task asked (another Python, skipped steps)."""

PYTHON_RELEASES = {python: release for release, python in images.RELEASES.items()}
"""The Debian release whose base image offers each Python."""
VENV = "/opt/orchard/venv"
WHEELHOUSE = "/opt/orchard/wheels"
_PTH = (
    "import os, site, sys; folder = site.getsitepackages()[0]; os.makedirs(folder, exist_ok=True); "
    "open(os.path.join(folder, 'orchard-venv.pth'), 'w').write(sys.argv[1] + chr(10))"
)
VENV_FOR_ANY_START = (
    f"/usr/bin/python3 -c {shlex.quote(_PTH)} "
    f'"$({VENV}/bin/python -c \'import sysconfig; print(sysconfig.get_paths()["purelib"])\')"'
)
"""The venv's packages seen by the base interpreter however it is started: a venv's `python` run
through a link in another folder (tox-current-env's `.tox/py39/bin/python`) finds no `pyvenv.cfg`
and runs as the base interpreter, which then imports what the spec installed all the same (as a
conda env's `python` does wherever it is linked from): a `.pth` in the base's own site folder."""
PRE_INSTALL_FAILED = "orchard: pre_install failed: "
NETWORK_COMMAND = re.compile(r"(^|[\s;&|(])(apt-get|apt|wget|curl)(\s|$)")
SWEBENCH_NAMESPACE = "swebench"
SWEBENCH_WORKDIR = "/testbed"
GRADING_FIELDS = ("test_cmd", "eval_commands", "parser")
"""The environment's fields that change how a task is graded, not its image."""
BUILD_PARTS = ("base", "interpreter", "dependencies", "repository")
"""The parts of a task image's build timed apart: the base image's layers (the base itself is
built once by `orchard image build-base`), the venv and the edits that make its Python report as
the one asked for, what SWE-bench's spec installs (resolving and downloading on the host
included), and the repository (checkout, `pre_install`, `install`)."""

# ---------------------------------------------------------------------------------------------
# which base image, which Python
# ---------------------------------------------------------------------------------------------


def choose_release(python: str | None) -> tuple[str, str | None]:
    """The Debian release whose Python a task runs on, and a warning when that is not the Python
    it asked for (the nearest offered; a tie goes to the older, whose test names match rows made
    under older Pythons)."""
    if python is None:
        return images.DEFAULT_RELEASE, None
    if python in PYTHON_RELEASES:
        return PYTHON_RELEASES[python], None
    wanted = _minor(python)
    nearest = min(PYTHON_RELEASES, key=lambda offered: (abs(_minor(offered) - wanted), _minor(offered)))
    release = PYTHON_RELEASES[nearest]
    return release, (
        f"wants Python {python}, which no base image offers: it runs on Python {nearest} "
        f"({images.base_tag(release)}), the nearest"
    )


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def image_labels(image: str) -> dict[str, str]:
    """A task image's labels (what its build read and warned about)."""
    import docker
    import docker.errors

    with closing(docker.from_env(timeout=60)) as client:
        try:
            return dict(client.images.get(image).labels or {})
        except docker.errors.ImageNotFound:
            raise ImageNotFound(f"image {image} is not on this engine") from None


def image_warnings(image: str) -> list[str]:
    """What a task image is not as its task asked (another Python, skipped `pre_install` lines,
    requirements read at another commit), from its labels; [] for an image without any."""
    return list(json.loads(image_labels(image).get(WARNINGS_LABEL) or "[]"))


@dataclasses.dataclass(frozen=True)
class Difference:
    """Something the Python a task asked for reports otherwise than the newer one it runs on
    does, and the edit of the image's standard library that makes it report as the older one:
    what a row's tests are named by comes from the output of the Python it was made under."""

    since: str
    """The first Python that reports otherwise; a task asking for an older one gets the edit."""
    what: str
    module: str
    new: str
    old: str

    def applies(self, asked: str | None, runs_on: str) -> bool:
        return asked is not None and _version(asked) < _version(self.since) <= _version(runs_on)

    def command(self) -> str:
        """The image build step that puts the old line back (and fails where the new is not there)."""
        script = (
            "import importlib.util, py_compile, sys; module, new, old = sys.argv[1:]; "
            "path = importlib.util.find_spec(module).origin; text = open(path).read(); "
            "text.count(new) == 1 or sys.exit('orchard: ' + path + ' does not say: ' + new); "
            "open(path, 'w').write(text.replace(new, old)); py_compile.compile(path, doraise=True)"
        )
        return shlex.join(["/usr/bin/python3", "-c", script, self.module, self.new, self.old])


DIFFERENCES = (
    Difference(
        "3.7",
        "unittest names a test by its docstring's first line only where that line is not empty (before 3.7, "
        "a docstring that begins with a newline gave no description; since, its first non-empty line does, "
        "and Django's runner prints it where SWE-bench's parser reads the test's name)",
        "unittest.case",
        'return doc.strip().split("\\n")[0].strip() if doc else None',
        'return doc and doc.split("\\n")[0].strip() or None',
    ),
)
"""What an older Python reports otherwise, found on rows graded here (docs/eval.md lists them)."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


# ---------------------------------------------------------------------------------------------
# what an environment installs, as SWE-bench's harness reads it
# ---------------------------------------------------------------------------------------------


def merged_requirements(read: Callable[[str], str | None], paths: Iterable[str]) -> tuple[str, str] | None:
    """SWE-bench's requirements text (`get_requirements_by_commit` + `clean_requirements`): the
    first of `paths` that `read` finds, its `-r` includes merged one level (before its own lines),
    `-e .`, `.[test...` and comment lines dropped, then SWE-bench's own `clean_requirements`
    (yanked packages replaced). Returns (text, path)."""
    for path in paths:
        text = read(path)
        if text is not None:
            break
    else:
        return None
    folder = path.rpartition("/")[0]
    own: list[str] = []
    included: list[str] = []
    for line in text.split("\n"):
        if line.strip().startswith("-r"):
            name = line.strip()[len("-r") :].strip()
            extra = read(f"{folder}/{name}" if folder else name)
            included += [each for each in (extra or "").split("\n") if not _dropped(each)]
        elif not _dropped(line):
            own.append(line)
    clean_requirements = swebench_module("harness.test_spec.python").clean_requirements
    return clean_requirements("\n".join([*included, "\n".join(own)])), path


def _dropped(line: str) -> bool:
    return line.strip().startswith(("-e .", "#", ".[test"))


CONDA_BARE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)=(?P<version>[^=<>!~\s]+)(?:=(?P<build>\S+))?$")


def conda_requirement(spec: str) -> str:
    """A conda package spec as a pip requirement: `channel::` dropped, bare `name=1.2` (conda's
    `1.2.*`) as `name==1.2.*`, `name=1.2=build` as `name==1.2`; anything else (`name>=1.2`,
    `name >=1.2,<2`, `name==1.2`) is already pip's syntax and passes as it is."""
    text = spec.strip().split("::", 1)[-1].strip()
    bare = CONDA_BARE.match(text)
    if bare is None:
        return text
    version = bare["version"]
    if bare["build"]:
        return f"{bare['name']}=={version}"
    return f"{bare['name']}=={version.removesuffix('*').removesuffix('.')}.*"


def environment_yml_requirements(text: str, *, what: str = "environment.yml") -> list[str]:
    """A conda environment file's packages as pip requirements (`conda_requirement`; `python` and
    `pip` themselves are the image's): an approximation, as for `packages`. Lines are returned
    as they are: the caller vets them."""
    import yaml

    clean_environment_yml = swebench_module("harness.test_spec.python").clean_environment_yml

    try:
        data = yaml.safe_load(clean_environment_yml(text))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} is not YAML: {' '.join(str(exc).split())[:200]}") from None
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("dependencies") or [], list):
        raise ConfigError(f"{what} is not a conda environment file (a mapping with a `dependencies` list)")
    requirements: list[str] = []
    for entry in data.get("dependencies") or []:
        if isinstance(entry, dict):
            pip = entry.get("pip") or []
            requirements += [str(each) for each in pip] if isinstance(pip, list) else []
            continue
        requirement = conda_requirement(str(entry))
        name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
        if name and canonicalize_name(name) not in ("python", "pip"):
            requirements.append(requirement)
    return requirements


def build_requirements(checkout: Path) -> list[str]:
    """What pip installs to build the repository: its `pyproject.toml`'s `[build-system] requires`,
    or setuptools and wheel (pip's default) where it names none."""
    try:
        text: str | None = (checkout / "pyproject.toml").read_text()
    except (OSError, UnicodeDecodeError):
        text = None
    return build_system_requires(text)


def install_extras(install: Iterable[str]) -> list[str]:
    """The extras an `install` command asks of the repository (`pip install -e .[test]`)."""
    extras: list[str] = []
    for command in install:
        for group in re.findall(r"""(?:^|[\s'"])\.\[([^\]]+)\]""", command):
            extras += [each.strip() for each in group.split(",") if each.strip()]
    return list(dict.fromkeys(extras))


def _wants_venv(env: Environment) -> bool:
    """Whether the image gets a venv and a wheelhouse: anything SWE-bench's spec installs. A row
    with no spec and nothing to install keeps the base image's Python and its pytest."""
    return bool(env.source != "row" or env.requirements or env.environment_yml or env.packages or env.pip_packages)


def _packages(words: Iterable[str]) -> list[str]:
    """Spec package words as requirements (a spec may quote them: `'numpy==1.19.2'`)."""
    return [word.strip("'\"") for word in words if word.strip("'\"")]


# ---------------------------------------------------------------------------------------------
# task images
# ---------------------------------------------------------------------------------------------


def setup_commit(task: SWETask, source: Path | None) -> tuple[str, str, str | None]:
    """The commit SWE-bench reads the environment files at, as (commit, description, warning):
    the row's `environment_setup_commit`, or `base_commit` (with a warning) where the mirror
    `source` lacks it (None: not looked at, nothing is read)."""
    wanted = task.environment_setup_commit or task.base_commit
    if wanted == task.base_commit or source is None or repos.has_commit(source, wanted):
        kind = "environment_setup_commit" if task.environment_setup_commit else "base_commit"
        return wanted, f"{wanted[:12]} ({kind})", None
    warning = (
        f"task {task.instance_id}: environment_setup_commit {wanted[:12]} is not in the mirror "
        f"{source}; its environment files are read at base_commit {task.base_commit[:12]}"
    )
    return (
        task.base_commit,
        f"{task.base_commit[:12]} (base_commit; environment_setup_commit not in the mirror)",
        warning,
    )


def image_tag(task: SWETask, base_id: str, read_at: str | None = None) -> str:
    """The tag of the image for `task`: named by repo, keyed by what it is built from (not by how
    it is graded), `read_at` being the commit its environment files were read at."""
    environment = {k: v for k, v in dataclasses.asdict(task.environment()).items() if k not in GRADING_FIELDS}
    recipe = {
        "format": FORMAT,
        "base": base_id,
        "repo": task.repo,
        "commit": task.base_commit,
        "environment_setup_commit": task.environment_setup_commit,
        "read_at": read_at,
        "version": task.version,
        "workdir": task.workdir,
        "environment": environment,
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    name = re.sub(r"[^a-z0-9_.-]", "-", task.repo.replace("/", "__").lower())[:96]
    return f"orchard/swe:{name}-{key}"


def swebench_image_name(task: SWETask) -> str:
    """SWE-bench's published instance image of `task` (`TestSpec.instance_image_key` of the
    `swebench` package with the `swebench` namespace)."""
    arch = "arm64" if platform.machine() in ("aarch64", "arm64") else "x86_64"
    return f"{SWEBENCH_NAMESPACE}/sweb.eval.{arch}.{task.instance_id.lower()}:latest".replace("__", "_1776_")


def task_image(task: SWETask, mirror: RepoMirror, *, source: str = "build", log: Log | None = None) -> str:
    """The image `task` runs in: the row's `image`; SWE-bench's own with `source="swebench"`
    (`Prepare` checks it is one of the two); else built (once) from the base image that has its
    Python."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=600)
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot reach the Docker engine to build task images: {exc}") from None
    try:
        if task.image:
            try:
                client.images.get(task.image)
            except docker.errors.ImageNotFound:
                raise ImageNotFound(f"task {task.instance_id}: image {task.image} is not on this engine") from None
            return task.image
        if source == "swebench":
            return _prebuilt(client, task)
        env = task.environment()
        release, python_warning = choose_release(env.python)
        base = images.base_tag(release)
        try:
            base_id = str(client.images.get(base).id)
        except docker.errors.ImageNotFound:
            wants = f" (task {task.instance_id} wants Python {env.python})" if env.python else ""
            raise ImageNotFound(
                f"base image {base} is missing{wants}: run `orchard image build-base --release {release}`"
            ) from None
        reads = env.requirements or env.environment_yml
        moved = task.environment_setup_commit not in (None, task.base_commit)
        read_at = setup_commit(task, mirror.path(task.repo) if reads and moved else None)
        tag = image_tag(task, base_id, read_at[0] if reads else None)
        with lock_for(tag):
            try:
                client.images.get(tag)
                return tag
            except docker.errors.ImageNotFound:
                pass
            say = log or quiet
            warnings = [] if python_warning is None else [f"task {task.instance_id} {python_warning}"]
            for warning in warnings:
                say(f"warning: {warning}")
            build = _Build(client, task, env, mirror.path(task.repo), read_at, base, tag, warnings, say)
            try:
                build.run()
            except (OSError, docker.errors.DockerException) as exc:
                raise SandboxError(f"task {task.instance_id}: building its image failed: {exc}") from None
            _record_build(tag, build.seconds, say)
        return tag
    finally:
        client.close()


def _build_file(tag: str) -> Path:
    return settings().cache_dir / "images" / (re.sub(r"[^A-Za-z0-9_.-]", "_", tag) + ".json")


def _record_build(tag: str, seconds: dict[str, float], say: Log) -> None:
    """Keep how long the parts of `tag`'s build took (`build_seconds` reads it back)."""
    figures = {part: round(value, 1) for part, value in seconds.items()}
    figures["total"] = round(sum(seconds.values()), 1)
    figures["at"] = round(time.time(), 3)
    path = _build_file(tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures) + "\n")
    say(f"built {tag} in {figures['total']:.0f} s ({describe_build(figures)})")


def build_seconds(tag: str) -> dict[str, float] | None:
    """How long the parts of `tag`'s build took (`BUILD_PARTS` and `total`) and when it ended
    (`at`, epoch seconds), where this machine built it; None for an image built elsewhere, or
    before builds were timed."""
    try:
        figures = json.loads(_build_file(tag).read_text())
    except (OSError, ValueError):
        return None
    keys = (*BUILD_PARTS, "total", "at")
    if not isinstance(figures, dict) or not all(isinstance(figures.get(key), int | float) for key in keys):
        return None
    return {key: float(figures[key]) for key in keys}


def describe_build(figures: dict[str, float]) -> str:
    """`interpreter 3 s, dependencies 25 s, repository 18 s` (the parts that took a second or more)."""
    parts = [f"{part} {figures[part]:.0f} s" for part in BUILD_PARTS if figures.get(part, 0) >= 0.5]
    return ", ".join(parts) or "no part took a second"


def _prebuilt(client: Any, task: SWETask) -> str:
    """SWE-bench's instance image of `task`, from the engine or pulled from its registry."""
    import docker.errors

    if task.workdir != SWEBENCH_WORKDIR:
        raise ConfigError(
            f"task {task.instance_id}: SWE-bench's images hold the repository at {SWEBENCH_WORKDIR}, "
            f"not at its workdir {task.workdir}"
        )
    name = swebench_image_name(task)
    try:
        client.images.get(name)
        return name
    except docker.errors.ImageNotFound:
        pass
    repository, _, tag = name.rpartition(":")
    try:
        client.images.pull(repository, tag=tag)
    except docker.errors.DockerException as exc:
        explained = str(getattr(exc, "explanation", None) or exc).strip().splitlines()[0]
        raise ImageNotFound(
            f"task {task.instance_id}: SWE-bench image {name} is not on this engine and pulling it failed "
            f"({explained}); pull it where a registry is reachable, or use --image-source build"
        ) from None
    return name


class _Build:
    """One task image: the checkout, the wheelhouse, then `docker build` with no network, in two
    stages when the repository is installed (its own dependencies are read from its metadata by
    pip in the first stage, resolved on the host, and added to the wheelhouse of the second)."""

    def __init__(
        self, client: Any, task: SWETask, env: Environment, source: Path, read_at: tuple[str, str, str | None],
        base: str, tag: str, warnings: list[str], log: Log,
    ):  # fmt: skip
        self.client, self.task, self.env, self.source, self.read_at = client, task, env, source, read_at
        self.base, self.tag, self.warnings, self.log = base, tag, warnings, log
        self.what = f"task {task.instance_id}"
        self.labels = {LABEL_PREFIX + "repo": task.repo, LABEL_PREFIX + "commit": task.base_commit}
        self.labels[LABEL_PREFIX + "environment"] = env.source
        self.steps: dict[str, str] = {}
        """Each Dockerfile instruction of an install step, with the step's name (for a failure)."""
        self.seconds = dict.fromkeys(BUILD_PARTS, 0.0)
        """How long each part of the build took: the host's work and the image's steps."""

    def run(self) -> None:
        with tempfile.TemporaryDirectory(prefix="orchard-task-") as tmp:
            context = Path(tmp)
            with self._timed("repository"):
                untagged = self._checkout(context / "repo")
            if not _wants_venv(self.env):
                lines = [f"FROM {self.base}", *self._repo_lines(untagged), *(f"RUN {c}" for c in self.env.install)]
                self._build(context, lines)
                return
            target = self._target()
            house = Wheelhouse(self.client, self.base, target, self.log)
            self.labels[LABEL_PREFIX + "python"] = target.python
            self.log(f"resolving {self.task.instance_id}'s dependencies for {target.describe()}")
            with self._timed("dependencies"):
                lines, have = self._environment(house, context)
            lines += self._repo_lines(untagged)
            kept = self._pre_install()
            nonce = secrets.token_hex(8)  # the repository's own output cannot forge a failure marker
            lines += [f"RUN ( {line} ) || echo '{PRE_INSTALL_FAILED}{nonce}-{i}'" for i, line in enumerate(kept)]
            stage = f"{self.tag}-stage"
            output = self._build(context, lines, tag=stage, labels={})
            try:
                failed = {int(n) for n in re.findall(rf"^{PRE_INSTALL_FAILED}{nonce}-(\d+)$", plain(output), re.M)}
                for i in sorted(n for n in failed if n < len(kept)):
                    self._warn(f"{self.what}: pre_install `{kept[i]}` failed; the build went on")
                later = context / "later"
                (later / "wheels").mkdir(parents=True)
                if self.env.install:
                    with self._timed("dependencies"):
                        self._project_wheels(house, stage, have, later / "wheels")
                install = [f"FROM {stage}", f"COPY wheels {WHEELHOUSE}", *self._named("install", self.env.install)]
                self._build(later, install)
            finally:
                self._untag(stage)

    def _target(self) -> Target:
        facts = images.base_facts(dict(self.client.images.get(self.base).labels or {}))
        if facts is None:
            release = self.base.rpartition(":")[2]
            raise ConfigError(
                f"base image {self.base} does not say its Python and glibc versions: "
                f"rebuild it with `orchard image build-base --release {release} --force`"
            )
        return Target(*facts, before=RESOLVED_BEFORE if self.env.source != "row" else None)

    def _checkout(self, checkout: Path) -> bool:
        """Check the repository out at `base_commit`; whether version-from-git tools would find
        no release tag there."""
        repos.checkout(self.source, checkout, self.task.base_commit, what=self.what)
        scm = any(re.match(r"(setuptools|hatch)[-_.](scm|vcs)", r, re.I) for r in build_requirements(checkout))
        return scm and repos.untagged(checkout, self.task.base_commit)

    def _repo_lines(self, untagged: bool) -> list[str]:
        lines = [
            f"COPY repo {self.task.workdir}",
            f"WORKDIR {self.task.workdir}",
            "RUN git config --global user.email agent@orchard.invalid && git config --global user.name agent"
            " && git config --global --add safe.directory '*'",
        ]
        version = self.task.version
        if untagged and version and re.fullmatch(r"[0-9][0-9A-Za-z.]*", version):
            self._warn(
                f"{self.what}: no release tag is reachable from base_commit in the mirror: "
                f"version-from-git tools are told the row's version (SETUPTOOLS_SCM_PRETEND_VERSION={version})"
            )
            lines.insert(0, f"ENV SETUPTOOLS_SCM_PRETEND_VERSION={version}")
        return lines

    def _environment(self, house: Wheelhouse, context: Path) -> tuple[list[str], set[str]]:
        """The Dockerfile lines of the venv and SWE-bench's environment steps, with their wheels
        resolved and placed in the context; also the files placed."""
        env, what = self.env, self.what
        tools = house.resolve(TOOLS, what=f"{what}: {', '.join(TOOLS)}")
        wheels = [*tools, *house.resolve(build_requirements(context / "repo"), what=f"{what}: build backend")]
        steps: list[str] = []
        requirements = self._requirements()
        if requirements is not None:
            found, kept = self._resolve_lines(house, requirements.split("\n"), "requirements", (SourceBuildFailed,))
            wheels += found
            (context / "requirements.txt").write_text("\n".join(kept) + "\n")
            steps += [
                "COPY requirements.txt /opt/orchard/requirements.txt",
                *self._named("requirements", ["python -m pip install -r /opt/orchard/requirements.txt"]),
            ]
        conda, conda_words = self._resolve_lines(house, self._conda_packages(), "packages", (MissingWheel,))
        pip_words = _packages(env.pip_packages)
        pip = house.resolve(pip_words, what=f"{what}: pip_packages")
        for step, found, words in (("packages", conda, conda_words), ("pip_packages", pip, pip_words)):
            if words:
                wheels += found
                steps += self._named(step, [f"python -m pip install {shlex.join(words)}"])
        fetch(wheels, context / "wheels", house.target, log=self.log)
        lines = [
            f"FROM {self.base}",
            f"COPY wheels {WHEELHOUSE}",
            f"ENV VIRTUAL_ENV={VENV} PATH={VENV}/bin:{images.SEARCH_PATH} PIP_NO_INDEX=1 PIP_FIND_LINKS={WHEELHOUSE}"
            " PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1",
            *self._named("the venv", [f"{venv_bootstrap(VENV, WHEELHOUSE, tools)} && {VENV_FOR_ANY_START}"]),
            *self._as_asked(house.target.python),
            *steps,
        ]
        return lines, {wheel.filename for wheel in wheels}

    def _resolve_lines(
        self, house: Wheelhouse, lines: list[str], name: str, leave_out: tuple[type[MissingWheel], ...]
    ) -> tuple[list[Wheel], list[str]]:
        """The wheels of the lines of a file the repository (or a spec) gives, and the lines
        kept: one that is not a plain requirement is left out with a warning, and so is one whose
        package fails as `leave_out` says (no wheel that builds here, most often: Django's test
        extras `pywatchman` and `pylibmc` need a C compiler). A failure of a package only a kept
        line depends on is still an error."""
        what = f"{self.what}: {name}"
        kept, refused = split_vetted(lines)
        for line in refused:
            self._warn(f"{what}: `{line[:200]}` is not a plain requirement (a direct reference or an option): left out")
        while True:
            try:
                return house.resolve(kept, what=what), kept
            except leave_out as exc:
                missing = _name(exc.requirement)
                fewer = [line for line in kept if _name(line) != missing]
                if missing is None or len(fewer) == len(kept):
                    raise
                self._warn(f"{exc}: left out of the {name}")
                kept = fewer

    def _requirements(self) -> str | None:
        """The requirements text SWE-bench would install, read from the mirror."""
        if not self.env.requirements:
            return None
        commit, at = self._read_at()
        found = merged_requirements(lambda path: repos.show(self.source, commit, path), self.env.requirements)
        if found is None:
            raise ConfigError(f"{self.what}: none of {', '.join(self.env.requirements)} is in {self.task.repo} at {at}")
        text, path = found
        self.labels[LABEL_PREFIX + "requirements"] = f"{path} at {at}"
        self.log(f"requirements: {path} at {at}")
        return text

    def _conda_packages(self) -> list[str]:
        words = [conda_requirement(word) for word in _packages(self.env.packages)]
        if self.env.environment_yml:
            commit, at = self._read_at()
            paths = self.env.environment_yml
            found = next(((p, t) for p in paths if (t := repos.show(self.source, commit, p)) is not None), None)
            if found is None:
                raise ConfigError(f"{self.what}: none of {', '.join(paths)} is in {self.task.repo} at {at}")
            words += environment_yml_requirements(found[1], what=f"{self.what}: {found[0]} at {at}")
        return words

    def _read_at(self) -> tuple[str, str]:
        commit, at, warning = self.read_at
        if warning:
            self._warn(warning)
        return commit, at

    def _pre_install(self) -> list[str]:
        """`pre_install` lines that can run offline; the others are skipped with a warning."""
        kept = []
        for line in self.env.pre_install:
            if NETWORK_COMMAND.search(line):
                self._warn(f"{self.what}: pre_install `{line}` needs the network: skipped")
            else:
                kept.append(line)
        return kept

    def _as_asked(self, runs_on: str) -> list[str]:
        """The edits that make the image's Python report as the one the task asked for does."""
        lines = []
        for difference in DIFFERENCES:
            if difference.applies(self.env.python, runs_on):
                self._warn(f"{self.what}: Python {runs_on} is made to report as {self.env.python}: {difference.what}")
                lines += self._named(f"Python {self.env.python}'s {difference.module}", [difference.command()])
        return lines

    @contextmanager
    def _timed(self, part: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[part] += time.monotonic() - started

    def _part(self, instruction: str) -> str:
        """Which part of the build an image instruction is (`BUILD_PARTS`)."""
        step = self.steps.get(instruction)
        if step is None:
            if instruction.startswith(("COPY wheels", "COPY requirements")):
                return "dependencies"
            return "base" if instruction.startswith(("FROM", "ENV")) else "repository"
        if step == "the venv" or step.startswith("Python "):
            return "interpreter"
        return "repository" if step == "install" else "dependencies"

    def _named(self, step: str, commands: Iterable[str]) -> list[str]:
        """`RUN` lines of `commands`, remembered as SWE-bench's install step `step`."""
        lines = [f"RUN {command}" for command in commands]
        self.steps.update((line, step) for line in lines)
        return lines

    def _warn(self, warning: str) -> None:
        """Record `warning` on the image (once) and say it in the build log."""
        if warning not in self.warnings:
            self.warnings.append(warning)
            self.log(f"warning: {warning}")

    def _project_wheels(self, house: Wheelhouse, stage: str, have: set[str], folder: Path) -> None:
        """The repository's own dependencies (and those of the extras `install` asks for): its
        metadata as pip reads it in the stage image (no network: the repository's code runs
        there, not on the host), resolved here under what the stage has installed (`pip
        freeze`), so that the versions SWE-bench's steps chose stay; the files not placed yet go
        to `folder`."""
        report = self._stage_output(
            stage, "python -m pip install --dry-run --quiet --no-deps --ignore-installed --report - .", "metadata"
        )
        what = f"{self.what}: the repository's dependencies"
        try:
            metadata = json.loads(report)["install"][0]["metadata"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise SandboxError(f"{self.what}: pip gave no metadata for the repository") from None
        project = Project.from_metadata(metadata, install_extras(self.env.install), what)
        frozen = self._stage_output(stage, "python -m pip freeze --all", "installed packages")
        pins = [
            line.strip()
            for line in frozen.splitlines()
            if re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", line.strip())
            and NAME.fullmatch(line.split("==")[0].strip())
            and canonicalize_name(line.split("==")[0]) != canonicalize_name(project.name)
        ]
        replaced = superseded(pins, project, house.target.python)
        for pin, asks in replaced.items():
            self.log(
                f"the repository's install replaces {pin}: it asks for {asks} (a later step wins, as in SWE-bench)"
            )
        pins = [pin for pin in pins if pin not in replaced]
        wheels = house.resolve([], what=what, project=project, constraints=pins)
        wanted = [w for w in wheels if w.filename not in have]
        self.log(f"{project.name} {project.version} needs {len(wheels)} distribution(s), {len(wanted)} more")
        fetch(wanted, folder, house.target, log=self.log)

    def _stage_output(self, stage: str, script: str, what: str) -> str:
        """The stdout of `script` run in the stage image, in the repository, with no network."""
        import docker.errors

        try:
            out = self.client.containers.run(
                stage, ["/bin/sh", "-c", script], working_dir=self.task.workdir, network_mode="none",
                remove=True, stdout=True, stderr=False,
            )  # fmt: skip
        except docker.errors.ContainerError as exc:
            tail = reason((exc.stderr or b"").decode(errors="replace"))
            raise SandboxError(
                f"{self.what}: pip could not read the repository's {what} in its image" + (f": {tail}" if tail else "")
            ) from None
        return bytes(out).decode(errors="replace")

    def _build(
        self, context: Path, lines: list[str], *, tag: str | None = None, labels: dict[str, str] | None = None
    ) -> str:
        """Build `context` with `lines` as its Dockerfile, no network; return what it printed."""
        tag = tag or self.tag
        if labels is None:
            labels = {**self.labels, WARNINGS_LABEL: json.dumps(self.warnings)}
        (context / "Dockerfile").write_text("\n".join(lines) + "\n")
        self.log(f"building {tag} ({self.task.repo} at {self.task.base_commit[:12]})")

        def failed(error: str, output: str) -> Exception:
            return SandboxError(
                f"{self.what}: building its image failed{_failed_step(output, self.steps)}: "
                f"{_build_failure(error, [output])}"
            )

        steps: list[tuple[str, float]] = []
        try:
            return docker_build(self.client, context, tag, failed, labels, steps)
        finally:
            for (instruction, started), (_, ended) in itertools.pairwise(steps):
                self.seconds[self._part(instruction)] += ended - started

    def _untag(self, tag: str) -> None:
        import docker.errors

        with suppress(docker.errors.APIError):  # already gone
            self.client.images.remove(tag)


def superseded(pins: Iterable[str], project: Project, python: str) -> dict[str, str]:
    """The installed versions (`name==v`) that the repository's own requirements (with the extras
    it is installed with, under `python`) exclude, each with the requirement that does: pip
    replaces those when it installs the repository, so a later step wins over an earlier one as
    in SWE-bench's harness (sphinx 3.x's `pip_packages` install Jinja2 3.0.3, then its `pre_install`
    makes `setup.py` ask for `Jinja2<3.0`). The other installed versions stay, as pip keeps them."""
    from packaging.markers import default_environment

    short = ".".join(python.split(".")[:2])
    host = {key: str(value) for key, value in default_environment().items()}
    environments = [
        {**host, "python_version": short, "python_full_version": python, "extra": extra}
        for extra in ("", *project.extras)
    ]
    wanted: dict[str, list[Requirement]] = {}
    for line in project.requires_dist:
        requirement = Requirement(line)
        if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
            wanted.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    replaced: dict[str, str] = {}
    for pin in pins:
        name, _, version = pin.partition("==")
        excluding = [
            r for r in wanted.get(canonicalize_name(name), []) if not r.specifier.contains(version, prereleases=True)
        ]
        if excluding:
            replaced[pin] = str(excluding[0])
    return replaced


def _name(requirement: str) -> str | None:
    """The canonical project name a requirement line names, or None."""
    try:
        return canonicalize_name(Requirement(requirement).name)
    except InvalidRequirement:
        return None


def _failed_step(output: str, steps: dict[str, str]) -> str:
    """` at <step>`: the install step of the last instruction the build output names, if any."""
    started = STEP.findall(plain(output))
    step = steps.get(started[-1].strip()) if started else None
    return f" at {step} (`{started[-1].strip().removeprefix('RUN ')[:160]}`)" if step else ""


def _build_failure(error: str, output: list[str]) -> str:
    """The reason a build failed, naming a package pip could not find offline."""
    text = "".join(output)
    missing = re.findall(r"No matching distribution found for (\S+)", text)
    if missing:
        return f"{missing[-1]} is not in the image's wheelhouse and there is no network ({error.strip()})"
    tail = text.strip().splitlines()[-3:]
    return error.strip() + (f" (last output: {' | '.join(tail)})" if tail else "")

"""Task images, built offline: the base image plus the repository at `base_commit`.

Repositories come from a local mirror folder (`--repos DIR`: `DIR/owner/name`, `DIR/owner__name`
or `DIR/name`, any git repository, bare or not) or are cloned from GitHub into the cache where a
network exists. The image is built with `docker build` and no network (`COPY` the checkout, then
the task's `install` commands), tagged by a hash of everything it is made of, so tasks sharing a
repository and commit share one image and a second build is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from orchard.config import BASE_IMAGE, settings
from orchard.errors import ConfigError, ImageNotFound, SandboxError
from orchard.tasks.swe import SWETask

FORMAT = 1
"""Bump when the image recipe changes, so older images are not reused."""
LABEL_PREFIX = "org.orchard.task."
GIT_TIMEOUT_S = 600

_build_locks: dict[str, threading.Lock] = {}
_build_locks_guard = threading.Lock()


class RepoMirror:
    """Finds a task's repository: in a local mirror folder, else cloned once into the cache."""

    def __init__(self, root: str | Path | None = None, *, clone: bool = True):
        self.root = Path(root).expanduser() if root else None
        if self.root is not None and not self.root.is_dir():
            raise ConfigError(f"--repos {self.root} is not a folder")
        self.clone = clone

    def candidates(self, repo: str) -> list[Path]:
        owner, name = repo.split("/")
        if self.root is None:
            return []
        names = [f"{owner}/{name}", f"{owner}__{name}", f"{owner}__{name}.git", name, f"{name}.git"]
        return [self.root / each for each in names]

    def path(self, repo: str) -> Path:
        """A local git repository holding `repo` (one clone at a time per repository)."""
        with _lock_for(f"repo:{repo}"):
            return self._path(repo)

    def _path(self, repo: str) -> Path:
        for candidate in self.candidates(repo):
            if _is_git_repo(candidate):
                return candidate
        cached = settings().cache_dir / "repos" / repo.replace("/", "__")
        if _is_git_repo(cached):
            return cached
        looked = ", ".join(str(p) for p in self.candidates(repo)) or "no --repos folder given"
        if not self.clone:
            raise ConfigError(f"repository {repo} not found (looked in {looked})")
        cached.parent.mkdir(parents=True, exist_ok=True)
        temp = cached.with_name(cached.name + ".partial")
        shutil.rmtree(temp, ignore_errors=True)
        try:
            _git("clone", "--quiet", "--mirror", f"https://github.com/{repo}.git", str(temp))
        except ConfigError as exc:
            shutil.rmtree(temp, ignore_errors=True)
            raise ConfigError(
                f"repository {repo} not found (looked in {looked}) and cloning it failed: {exc}; "
                "pass --repos DIR with a local copy"
            ) from None
        try:
            temp.rename(cached)
        except OSError as exc:
            raise ConfigError(f"could not store the clone of {repo} in {cached}: {exc}") from None
        return cached


def _is_git_repo(path: Path) -> bool:
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


def _git(*args: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise ConfigError("git is not installed on this host") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"git {args[0]} took more than {GIT_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(f"git {args[0]} failed: {lines[-1] if lines else f'exit {done.returncode}'}")
    return done.stdout


def image_tag(task: SWETask, base_id: str) -> str:
    """The tag of the image for `task`: named by repo, keyed by what it is built from."""
    recipe = {
        "format": FORMAT,
        "base": base_id,
        "repo": task.repo,
        "commit": task.base_commit,
        "workdir": task.workdir,
        "install": task.install,
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    name = re.sub(r"[^a-z0-9_.-]", "-", task.repo.replace("/", "__").lower())[:96]
    return f"orchard/swe:{name}-{key}"


def task_image(
    task: SWETask,
    mirror: RepoMirror,
    *,
    base_image: str = BASE_IMAGE,
    log: Callable[[str], None] | None = None,
) -> str:
    """The image `task` runs in, built (once) if the task does not name one."""
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
        try:
            base_id = str(client.images.get(base_image).id)
        except docker.errors.ImageNotFound:
            raise ImageNotFound(f"base image {base_image} is missing: run `orchard image build-base`") from None
        tag = image_tag(task, base_id)
        with _lock_for(tag):
            try:
                client.images.get(tag)
                return tag
            except docker.errors.ImageNotFound:
                pass
            try:
                _build(client, task, mirror, base_image, tag, log or (lambda _line: None))
            except (OSError, docker.errors.DockerException) as exc:
                raise SandboxError(f"task {task.instance_id}: building its image failed: {exc}") from None
        return tag
    finally:
        client.close()


def _lock_for(tag: str) -> threading.Lock:
    with _build_locks_guard:
        return _build_locks.setdefault(tag, threading.Lock())


def _build(client, task: SWETask, mirror: RepoMirror, base_image: str, tag: str, log: Callable[[str], None]) -> None:
    source = mirror.path(task.repo)
    with tempfile.TemporaryDirectory(prefix="orchard-task-") as tmp:
        context = Path(tmp)
        checkout = context / "repo"
        _git("clone", "--quiet", "--no-hardlinks", "--no-checkout", str(source), str(checkout))
        try:
            _git("checkout", "--quiet", "--detach", task.base_commit, cwd=checkout)
        except ConfigError:
            raise ConfigError(f"task {task.instance_id}: commit {task.base_commit} is not in {source}") from None
        _git("remote", "remove", "origin", cwd=checkout)
        lines = [
            f"FROM {base_image}",
            f"COPY repo {task.workdir}",
            f"WORKDIR {task.workdir}",
            "RUN git config --global user.email agent@orchard.invalid && git config --global user.name agent"
            " && git config --global --add safe.directory '*'",
            *(f"RUN {command}" for command in task.install),
        ]
        (context / "Dockerfile").write_text("\n".join(lines) + "\n")
        labels = {LABEL_PREFIX + "repo": task.repo, LABEL_PREFIX + "commit": task.base_commit}
        log(f"building {tag} ({task.repo} at {task.base_commit[:12]})")
        output: list[str] = []
        for chunk in client.api.build(
            path=str(context), tag=tag, network_mode="none", rm=True, forcerm=True, labels=labels, decode=True
        ):
            if "stream" in chunk:
                output.append(chunk["stream"])
            if "error" in chunk:
                tail = "".join(output).strip().splitlines()[-3:]
                raise SandboxError(
                    f"task {task.instance_id}: building its image failed: {chunk['error'].strip()}"
                    + (f" (last output: {' | '.join(tail)})" if tail else "")
                )

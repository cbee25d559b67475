"""Task repositories: where a task's repository is found, and its checkout at `base_commit` as
the agent gets it.

Repositories come from a local mirror folder (`--repos DIR`: `DIR/owner/name`, `DIR/owner__name`
or `DIR/name`, any git repository, bare or not) or are cloned from GitHub into the cache where a
network exists. A mirror is untrusted input: git runs on it with hooks and fsmonitor off and no
system config, and a checkout holds nothing of it newer than `base_commit` (`checkout`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

from orchard.config import settings
from orchard.errors import ConfigError

GIT_TIMEOUT_S = 600
SAFE_GIT = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")
"""Options of every git run here: a repository's own config must not make the host run its code."""
MIRROR_TAG = re.compile(r"base-[0-9a-f]{40}")
"""The tags a mirror made of single-commit repositories marks each base commit with
(`base-<sha>`): no release of the project, so they are never copied into a checkout."""

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def lock_for(key: str) -> threading.Lock:
    """One lock per key (a repository, an image tag) in this process."""
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


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
        with lock_for(f"repo:{repo}"):
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
            git("clone", "--quiet", "--mirror", f"https://github.com/{repo}.git", str(temp))
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


def git(*args: str, cwd: Path | None = None, stdin: str | None = None) -> str:
    """Run git safely on an untrusted repository; its stdout, or ConfigError with its last line."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    try:
        done = subprocess.run(
            ["git", *SAFE_GIT, *args], cwd=cwd, input=stdin, capture_output=True, text=True,
            timeout=GIT_TIMEOUT_S, check=False, env=env,
        )  # fmt: skip
    except FileNotFoundError:
        raise ConfigError("git is not installed on this host") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"git {args[0]} took more than {GIT_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(f"git {args[0]} failed: {lines[-1] if lines else f'exit {done.returncode}'}")
    return done.stdout


def checkout(source: Path, folder: Path, commit: str, *, what: str) -> None:
    """Make `folder` a repository holding `source` at `commit` and nothing newer (SWE-bench's rule:
    the agent must not see the future): only `commit`'s history is fetched, no branch, and of the
    tags only those reachable from `commit`, less the mirror's `base-<sha>` markers (they break
    version-from-tag tools such as setuptools_scm). A fetch, not a local clone: no alternates, no
    hard links into the mirror."""
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ConfigError(f"{what}: base_commit {commit!r} is not a full commit sha (40 hex digits)")
    source = source.resolve()  # git runs in `folder`
    git("init", "--quiet", str(folder))
    try:
        git("fetch", "--quiet", "--no-tags", str(source), commit, cwd=folder)
        git("checkout", "--quiet", "--detach", commit, cwd=folder)
    except ConfigError:
        raise ConfigError(f"{what}: commit {commit} is not in {source}") from None
    tags = [t for t in git("tag", "--merged", commit, cwd=source).split() if not MIRROR_TAG.fullmatch(t)]
    if tags:
        refspecs = "".join(f"refs/tags/{tag}:refs/tags/{tag}\n" for tag in tags)
        git("fetch", "--quiet", "--no-tags", "--stdin", str(source), cwd=folder, stdin=refspecs)


def untagged(repo: Path, commit: str) -> bool:
    """Whether no tag is reachable from `commit` (a shallow mirror's), so that setuptools_scm
    (or hatch-vcs) would call the project `0.1.dev1` where SWE-bench's full clone gives its
    release (pytest's own `minversion` check then fails)."""
    try:
        git("describe", "--tags", "--abbrev=0", commit, cwd=repo)
    except ConfigError:
        return True
    return False


def has_commit(repo: Path, commit: str) -> bool:
    try:
        git("cat-file", "-e", f"{commit}^{{commit}}", cwd=repo)
    except ConfigError:
        return False
    return True


def show(repo: Path, commit: str, path: str) -> str | None:
    """The text of `path` at `commit`, or None where it has no such file."""
    try:
        return git("show", f"{commit}:{path}", cwd=repo)
    except ConfigError:
        return None

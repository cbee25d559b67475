#!/usr/bin/env python3
"""Materialise the example projects as one-commit git repositories.

    python examples/tasks/make_repos.py DEST_DIR [--force]

For every project in ``projects/`` this creates
``DEST_DIR/orchard-examples__<name>``: a git repository whose single commit
holds exactly the project's files (generated files such as ``__pycache__``
are skipped).  Author, committer, dates, file modes and git configuration
are pinned, so the commit hashes are the same on every machine; they are
the ``base_commit`` values in ``tasks.jsonl``.  Prints ``<repo> <commit>``
per project.  Stdlib only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECTS_DIR = HERE / "projects"
ORG = "orchard-examples"
VERSION = "1.0"
COMMIT_DATE = "2026-01-01T00:00:00+00:00"
IDENTITY = ("Orchard Examples", "examples@orchard.invalid")

SKIP_DIRS = {
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".venv",
    "venv",
    ".git",
    ".eggs",
    "build",
    "dist",
    "htmlcov",
}
SKIP_FILE_SUFFIXES = (".pyc", ".pyo", ".orig", ".rej", ".swp", "~")
SKIP_FILES = {".DS_Store", ".coverage"}

GIT_CONFIG = [
    "-c",
    "init.defaultBranch=main",
    "-c",
    "core.fileMode=true",
    "-c",
    "core.autocrlf=false",
    "-c",
    "core.safecrlf=false",
    "-c",
    "commit.gpgsign=false",
    "-c",
    f"core.hooksPath={os.devnull}",
]


def project_names() -> list[str]:
    return sorted(
        entry.name for entry in PROJECTS_DIR.iterdir() if entry.is_dir() and (entry / "pyproject.toml").is_file()
    )


def repo_dir_name(name: str) -> str:
    return f"{ORG}__{name}"


def project_files(root: Path) -> list[Path]:
    """Relative paths of the project's source files, sorted."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for filename in sorted(filenames):
            path = Path(dirpath) / filename
            if filename in SKIP_FILES or filename.endswith(SKIP_FILE_SUFFIXES):
                continue
            if path.is_symlink() or not path.is_file():
                continue
            files.append(path.relative_to(root))
    return files


def git_env() -> dict:
    """Environment that makes git ignore user/system config and pins identity."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_AUTHOR_NAME=IDENTITY[0],
        GIT_AUTHOR_EMAIL=IDENTITY[1],
        GIT_COMMITTER_NAME=IDENTITY[0],
        GIT_COMMITTER_EMAIL=IDENTITY[1],
        GIT_AUTHOR_DATE=COMMIT_DATE,
        GIT_COMMITTER_DATE=COMMIT_DATE,
        TZ="UTC",
        LC_ALL="C",
    )
    return env


def git(args: list[str], cwd: Path) -> str:
    result = subprocess.run(
        ["git", *GIT_CONFIG, *args],
        cwd=cwd,
        env=git_env(),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}:\n{result.stderr}")
    return result.stdout.strip()


def make_repo(name: str, dest_root: Path, force: bool = False) -> tuple[Path, str]:
    """Create ``dest_root/orchard-examples__<name>``; returns (path, commit)."""
    source = PROJECTS_DIR / name
    target = Path(dest_root) / repo_dir_name(name)
    if target.exists():
        if not force and any(target.iterdir()):
            raise FileExistsError(f"{target} exists and is not empty (use --force)")
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for relative in project_files(source):
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / relative, destination)
    return target, commit_tree(target, f"{name} {VERSION}")


def commit_tree(target: Path, message: str) -> str:
    """Make the folder `target` a git repository whose one commit holds all its files, modes
    pinned (755 folders, 644 files); returns the commit."""
    os.chmod(target, 0o755)
    for dirpath, dirnames, filenames in os.walk(target):
        for dirname in dirnames:
            os.chmod(os.path.join(dirpath, dirname), 0o755)
        for filename in filenames:
            os.chmod(os.path.join(dirpath, filename), 0o644)
    git(["init", "-q", "--template="], target)  # no sample hooks: nothing the commit holds, and smaller
    git(["add", "-A"], target)
    git(["commit", "-q", "--no-verify", "-m", message], target)
    return git(["rev-parse", "HEAD"], target)


def make_all(dest_root: Path, force: bool = False) -> dict[str, tuple[Path, str]]:
    """Materialise every project; returns {name: (path, commit)}."""
    Path(dest_root).mkdir(parents=True, exist_ok=True)
    return {name: make_repo(name, Path(dest_root), force) for name in project_names()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="folder to create the repositories in")
    parser.add_argument("--force", action="store_true", help="replace existing repositories")
    args = parser.parse_args(argv)
    try:
        repos = make_all(args.dest, args.force)
    except (FileExistsError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, (_path, commit) in repos.items():
        print(f"{ORG}/{name} {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

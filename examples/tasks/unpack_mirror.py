"""Unpack one-commit repository archives into a mirror folder for `orchard eval --repos DIR`.

    python examples/tasks/unpack_mirror.py swe-real/repos DIR

Each `<owner>__<name>-<sha7>.tar.gz` holds one folder of that name: a shallow git repository whose
HEAD is a task's `base_commit`. They are fetched into `DIR/<owner>/<name>` (archives of one
repository, django's two here, into one repository), each commit tagged `base-<sha>`. Running it
again is safe.
"""

from __future__ import annotations

import argparse
import subprocess
import tarfile
import tempfile
from pathlib import Path


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()


def unpack(archives: Path, mirror: Path) -> list[Path]:
    repos = []
    for archive in sorted(archives.glob("*.tar.gz")):
        name = archive.name.removesuffix(".tar.gz")
        owner, repo = name.rsplit("-", 1)[0].split("__", 1)
        target = mirror / owner / repo
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            source = str(Path(tmp) / name)
            head = git("-C", source, "rev-parse", "HEAD")
            if not (target / ".git").exists():
                git("init", "-q", str(target))
            git("-C", str(target), "fetch", "-q", "--update-shallow", source, f"HEAD:refs/tags/base-{head}")
        if target not in repos:
            repos.append(target)
    return repos


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archives", type=Path, help="the folder of *.tar.gz archives")
    parser.add_argument("mirror", type=Path, help="the mirror folder to fill (DIR/owner/name)")
    options = parser.parse_args()
    for path in unpack(options.archives, options.mirror):
        print(path)

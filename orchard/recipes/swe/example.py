"""The SWE recipe's example, as `orchard demo` runs it: its repositories made first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from orchard.config import settings


def prepare(config: dict[str, Any], examples: Path) -> None:
    """The example tasks' repositories (`examples/tasks/make_repos.py`: git repositories with fixed
    commits, under the cache folder), and the eval stage on (the tests leave it off)."""
    repos = settings().cache_dir / "example-repos"
    subprocess.run(
        [sys.executable, str(examples / "tasks" / "make_repos.py"), "--force", str(repos)],
        check=True,
        capture_output=True,
    )
    config["repos"] = str(repos)
    config["eval"]["enabled"] = True

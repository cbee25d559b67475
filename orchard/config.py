"""Settings, in one place: environment variables `ORCHARD_*` with sensible defaults.

| variable | default | meaning |
|---|---|---|
| `ORCHARD_HOME` | `~/.orchard` | the store, the service's state and API key |
| `ORCHARD_DB_URL` | `sqlite:///$ORCHARD_HOME/orchard.db` | any SQLAlchemy URL (PostgreSQL for many hosts) |
| `ORCHARD_CACHE_DIR` | `$XDG_CACHE_HOME/orchard` or `~/.cache/orchard` | agent bundles, root filesystems |
| `ORCHARD_RUN_DIR` | `$XDG_RUNTIME_DIR/orchard` or `/tmp/orchard-$UID` | per-sandbox socket folders (short paths: Unix sockets allow 107 bytes) |
| `ORCHARD_URL` / `SANDBOX_BASE_URL` | unset | a running `orchard up` service for the SDK and the CLI |
| `ORCHARD_API_KEY` / `SANDBOX_API_KEY` | unset | its API key |

`ORCHARD_HOME` holds keys, the store and logs: it is made mode 0700 (a wider one is tightened)
and the files in it 0600 (`private_folder`, `private_file`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

BASE_IMAGE = "orchard/base:bookworm"
"""The Debian image `orchard image build-base` makes offline; the default image of sandboxes."""


@dataclass(frozen=True)
class Settings:
    """Resolved settings; build with `settings()` so the environment is read at call time."""

    home: Path
    """Folder of the store, the service state and the API key."""
    db_url: str
    """SQLAlchemy URL of the store."""
    cache_dir: Path
    """Folder of reusable build products (agent bundles, root filesystems)."""
    run_dir: Path
    """Folder of per-sandbox socket folders; kept short for Unix socket paths."""
    service_url: str | None
    """URL of a running `orchard up` service, if any."""
    api_key: str | None
    """API key of that service, if given."""

    @property
    def service_state(self) -> Path:
        """File where a running `orchard up` records its pid, URL and key (mode 0600)."""
        return self.home / "service.json"


def settings() -> Settings:
    """Read the settings from the environment now."""
    env = os.environ
    home = Path(env.get("ORCHARD_HOME") or Path.home() / ".orchard").expanduser()
    xdg_cache = env.get("XDG_CACHE_HOME")
    cache = env.get("ORCHARD_CACHE_DIR") or (
        Path(xdg_cache) / "orchard" if xdg_cache else Path.home() / ".cache" / "orchard"
    )
    xdg_run = env.get("XDG_RUNTIME_DIR")
    run = env.get("ORCHARD_RUN_DIR") or (Path(xdg_run) / "orchard" if xdg_run else Path(f"/tmp/orchard-{os.getuid()}"))
    return Settings(
        home=home,
        db_url=env.get("ORCHARD_DB_URL") or f"sqlite:///{home / 'orchard.db'}",
        cache_dir=Path(cache).expanduser(),
        run_dir=Path(run).expanduser(),
        service_url=env.get("ORCHARD_URL") or env.get("SANDBOX_BASE_URL") or None,
        api_key=env.get("ORCHARD_API_KEY") or env.get("SANDBOX_API_KEY") or None,
    )


def private_folder(path: Path) -> Path:
    """`path`, made mode 0700, or tightened to it when wider: what Orchard keeps there is the operator's.

    A folder that is not ours to change is left as it is, with a warning.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """`path`, created empty with mode 0600 if missing, or tightened to it when wider."""
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT, 0o600))
    _tighten(path, 0o600)
    return path


def _tighten(path: Path, most: int) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & ~most:
        try:
            path.chmod(mode & most)
        except PermissionError:
            logging.getLogger("orchard").warning("%s is mode %o, not %o, and not ours to change", path, mode, most)

"""Settings, in one place: environment variables `ORCHARD_*` with sensible defaults.

| variable | default | meaning |
|---|---|---|
| `ORCHARD_HOME` | `~/.orchard` | the store, the service's state and API key |
| `ORCHARD_DB_URL` | `sqlite:///$ORCHARD_HOME/orchard.db` | any SQLAlchemy URL (PostgreSQL for many hosts) |
| `ORCHARD_CACHE_DIR` | `$XDG_CACHE_HOME/orchard` or `~/.cache/orchard` | agent bundles, root filesystems |
| `ORCHARD_RUN_DIR` | `$XDG_RUNTIME_DIR/orchard` or `/tmp/orchard-$UID` | per-sandbox socket folders (short paths: Unix sockets allow 107 bytes) |
| `ORCHARD_URL` / `SANDBOX_BASE_URL` | unset | a running `orchard up` service for the SDK and the CLI |
| `ORCHARD_API_KEY` / `SANDBOX_API_KEY` | unset | its API key |
| `HF_HUB_OFFLINE` / `HF_ENDPOINT` | unset / `https://huggingface.co` | the Hugging Face hub (`require_hub`) |

`ORCHARD_HOME` holds keys, the store and logs: it is made mode 0700 (a wider one is tightened)
and the files in it 0600 (`private_folder`, `private_file`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from orchard.errors import ConfigError

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


def examples_folder() -> Path:
    """The example tasks, configs and sites: the copy an installed wheel ships (`orchard/_examples`,
    setup.py), else the source checkout's `examples/`."""
    package = Path(__file__).resolve().parent
    for folder in (package / "_examples", package.parent / "examples"):
        if (folder / "tasks" / "tasks.jsonl").is_file():
            return folder
    raise ConfigError(f"no example files beside {package}: reinstall Orchard (its wheel ships them)")


def private_folder(path: Path) -> Path:
    """`path`, made mode 0700, or tightened to it when wider: what Orchard keeps there is the operator's.

    A folder that is not ours to change is left as it is, with a warning.
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the folder {path}: {exc.strerror or exc}{_home_hint(path)}") from None
    _tighten(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """`path`, created empty with mode 0600 if missing, or tightened to it when wider."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT, 0o600))
    except OSError as exc:
        raise ConfigError(f"cannot create the file {path}: {exc.strerror or exc}{_home_hint(path)}") from None
    _tighten(path, 0o600)
    return path


def _home_hint(path: Path) -> str:
    home = settings().home
    return f"; set ORCHARD_HOME to a folder you can write (now {home})" if path.is_relative_to(home) else ""


def _tighten(path: Path, most: int) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & ~most:
        try:
            path.chmod(mode & most)
        except PermissionError:
            logging.getLogger("orchard").warning("%s is mode %o, not %o, and not ours to change", path, mode, most)


def require_hub(name: str) -> None:
    """Fail at once, with one line, when `name` would come from a Hugging Face hub that does not answer.

    The hub's clients retry for about 30 s before they give up; one TCP connection to the hub's
    endpoint (`HF_ENDPOINT`), or to the proxy that reaches it, tells in a few seconds. With
    `HF_HUB_OFFLINE` set nothing is checked: the clients then read only the local cache, and fail
    at once themselves.
    """
    import socket
    import urllib.request
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return
    target = endpoint = urlsplit(constants.ENDPOINT)
    proxy = urllib.request.getproxies().get(endpoint.scheme)
    if proxy and not urllib.request.proxy_bypass(endpoint.hostname or ""):
        target = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((target.hostname or "", port), timeout=5).close()
    except OSError as exc:
        raise ConfigError(
            f"cannot reach the Hugging Face hub at {constants.ENDPOINT} for {name!r} ({exc.strerror or exc}): "
            "connect to a network, or set HF_HUB_OFFLINE=1 to use the local cache"
        ) from None

"""The environment layer: isolated sandboxes reached through an injected exec agent.

`Client` / `AsyncClient` are the SDK; `SandboxManager` is the lifecycle underneath; backends
(`orchard.env.backends`) create containers; `orchard.env.service` serves the Orchard Env REST API.
Importing this package is light: Docker and FastAPI load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchard.env.calls import ExecResult, FileInfo, PatchResult
    from orchard.env.client import AsyncClient, AsyncSandbox, Client, Sandbox
    from orchard.env.manager import SandboxManager

__all__ = [
    "AsyncClient",
    "AsyncSandbox",
    "Client",
    "ExecResult",
    "FileInfo",
    "PatchResult",
    "Sandbox",
    "SandboxManager",
]

_WHERE = {
    "AsyncClient": "orchard.env.client",
    "AsyncSandbox": "orchard.env.client",
    "Client": "orchard.env.client",
    "Sandbox": "orchard.env.client",
    "ExecResult": "orchard.env.calls",
    "FileInfo": "orchard.env.calls",
    "PatchResult": "orchard.env.calls",
    "SandboxManager": "orchard.env.manager",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'orchard.env' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)

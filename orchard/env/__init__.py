"""The environment layer: isolated sandboxes reached through an injected exec agent.

`Client` / `AsyncClient` are the SDK; `SandboxManager` is the lifecycle underneath; backends
(`orchard.env.backends`) create containers; `orchard.env.service` serves the Orchard Env REST API,
and `orchard.env.discovery` finds the one running on this host. The SDK and the service share the
wire calls (`orchard.env.calls`), never each other's code. Importing this package is light: Docker
and FastAPI load only when used.

Trust: everything inside a sandbox is hostile, the exec agent included. A process there can
kill, stop or ptrace the agent, take its listening socket and answer in its place, so the host
(the SDK, the manager, the service, the grader) treats every byte that comes back as untrusted
input: every answer is bounded before it is read, large ones are streamed, archives are
extracted only after each member is checked (regular files and folders inside the target), the
socket is never reached through a link, and a grade is decided only by the task's own tests on
the task's own test infrastructure. The README's security table lists each claim with the test
that attacks it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

IMAGES: dict[str, str] = {
    "base": "orchard.env.images:build_base",
    "busybox": "orchard.env.images:build_busybox",
    "agent": "orchard.env.images:build_agent",
    "service": "orchard.deploy:build_service",
}
"""The images every recipe may use, and the service's own for a cluster (`orchard.deploy`, above
this layer: named here, never imported), by the name `orchard image build NAME` takes:
`name -> "module:build"`. Each recipe adds its own (`orchard.recipes.Recipe.images`)."""

if TYPE_CHECKING:
    from orchard.env.calls import ExecResult, FileInfo, HttpAnswer, PatchResult
    from orchard.env.client import AsyncClient, AsyncSandbox, Client, Exposure, Sandbox
    from orchard.env.manager import SandboxManager

__all__ = [
    "IMAGES",
    "AsyncClient",
    "AsyncSandbox",
    "Client",
    "ExecResult",
    "Exposure",
    "FileInfo",
    "HttpAnswer",
    "PatchResult",
    "Sandbox",
    "SandboxManager",
]

_WHERE = {
    "AsyncClient": "orchard.env.client",
    "AsyncSandbox": "orchard.env.client",
    "Client": "orchard.env.client",
    "Exposure": "orchard.env.client",
    "Sandbox": "orchard.env.client",
    "ExecResult": "orchard.env.calls",
    "FileInfo": "orchard.env.calls",
    "HttpAnswer": "orchard.env.calls",
    "PatchResult": "orchard.env.calls",
    "SandboxManager": "orchard.env.manager",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'orchard.env' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)

"""Sandbox backends: where containers live. Each is built lazily from a typed config.

A backend only does lifecycle (create, inspect, delete, list); commands and files never go
through it: the client talks to the exec agent inside the sandbox directly.
"""

from __future__ import annotations

from orchard.env.backends.base import (
    AgentEndpoint,
    Backend,
    BackendSandbox,
    SandboxSpec,
    SandboxState,
)
from orchard.env.backends.docker import DockerConfig
from orchard.errors import ConfigError

BackendConfig = DockerConfig
"""Configs of every backend; a union discriminated by `type` once Kubernetes joins."""

_CONFIGS: dict[str, type[DockerConfig]] = {"docker": DockerConfig}


def backend_config(name: str) -> BackendConfig:
    """The default config of the backend called `name`, with an error listing the known ones."""
    try:
        return _CONFIGS[name]()
    except KeyError:
        known = ", ".join(sorted(_CONFIGS))
        raise ConfigError(f"unknown backend {name!r}: choose one of {known}") from None


__all__ = [
    "AgentEndpoint",
    "Backend",
    "BackendConfig",
    "BackendSandbox",
    "DockerConfig",
    "SandboxSpec",
    "SandboxState",
    "backend_config",
]

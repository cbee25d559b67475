"""Sandbox backends: where containers live. Each is built lazily from a typed config.

A backend only does lifecycle (create, inspect, delete, list); commands and files never go
through it: the client talks to the exec agent inside the sandbox directly.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from orchard.env.backends.base import (
    AgentEndpoint,
    Backend,
    BackendSandbox,
    SandboxSpec,
    SandboxState,
)
from orchard.env.backends.docker import DockerConfig
from orchard.errors import ConfigError

BackendConfig = Annotated[DockerConfig, Field(discriminator="type")]
"""A discriminated union over `type`; Kubernetes joins it in its own module."""

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

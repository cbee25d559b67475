"""Sandbox backends: where containers live. Each is built lazily from a typed config.

A backend only does lifecycle (create, inspect, delete, list); commands and files never go
through it: the client talks to the exec agent inside the sandbox directly.

`BACKENDS` names each backend's config class; `backend_config` takes a name there or the full
import path (`module:Class`) of a config with a `build()`. Importing this package is light: a
backend's module loads only when its config is asked for, its client library only at `build()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchard.env.backends.base import (
    AgentEndpoint,
    Backend,
    BackendSandbox,
    SandboxSpec,
    SandboxState,
)
from orchard.errors import ConfigError
from orchard.registry import load

if TYPE_CHECKING:
    from orchard.env.backends.docker import DockerConfig
    from orchard.env.backends.kubernetes import KubernetesConfig

    BackendConfig = DockerConfig | KubernetesConfig
    """Configs of every backend (each names itself in `type`)."""

BACKENDS: dict[str, str] = {
    "docker": "orchard.env.backends.docker:DockerConfig",
    "kubernetes": "orchard.env.backends.kubernetes:KubernetesConfig",
}
"""Backends by name: `name -> "module:ConfigClass"`."""


def backend_config(name: str) -> BackendConfig:
    """The default config of the backend `name` (or `module:Class`); an unknown one lists the known ones."""
    config = load(BACKENDS, name, "backend")
    if not (isinstance(config, type) and callable(getattr(config, "build", None))):
        raise ConfigError(f"backend {name!r} is not a backend config (a class with a build() method)")
    return config()


def __getattr__(name: str) -> Any:
    """`DockerConfig`, `KubernetesConfig` and `BackendConfig` (their union), imported when first asked for."""
    if name == "KubernetesConfig":
        from orchard.env.backends.kubernetes import KubernetesConfig

        return KubernetesConfig
    if name not in ("DockerConfig", "BackendConfig"):
        raise AttributeError(f"module 'orchard.env.backends' has no attribute {name!r}")
    from orchard.env.backends.docker import DockerConfig

    if name == "BackendConfig":
        from orchard.env.backends.kubernetes import KubernetesConfig

        return DockerConfig | KubernetesConfig
    return DockerConfig


__all__ = [
    "BACKENDS",
    "AgentEndpoint",
    "Backend",
    "BackendConfig",
    "BackendSandbox",
    "DockerConfig",
    "KubernetesConfig",
    "SandboxSpec",
    "SandboxState",
    "backend_config",
]

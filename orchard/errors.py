"""Orchard's exceptions: one root, and children that also inherit the matching builtin.

    OrchardError
    ├── ConfigError(ValueError)          a setting or an argument is wrong; the message says how to fix it
    ├── NotFound(LookupError)            an unknown sandbox, job, file or image
    │   └── ImageNotFound(SandboxError)  a sandbox's image is not in the engine
    ├── InvalidRequest(ValueError)       a request the agent or service refuses (bad path, bad cwd, ...)
    │   ├── Conflict                     the name is taken (a sandbox id already in use)
    │   └── TooLarge                     what a sandbox holds or sent is over the host's limit
    ├── AuthError(PermissionError)       a missing or wrong token / API key
    ├── EngineUnavailable(ConnectionError)  the container engine or the service cannot be reached
    ├── SandboxError(RuntimeError)       a sandbox failed to start or died
    │   └── SandboxNotReady(TimeoutError)    it did not become ready in time
    ├── AgentError(ConnectionError)      the exec agent did not answer
    └── Overloaded(RuntimeError)         transient overload (HTTP 503); safe to retry later

Everything else is a bug and is never swallowed.
"""


class OrchardError(Exception):
    """Root of every error Orchard raises on purpose."""


class ConfigError(OrchardError, ValueError):
    """A setting or argument is wrong."""


class NotFound(OrchardError, LookupError):
    """An unknown sandbox, job, file or image."""


class InvalidRequest(OrchardError, ValueError):
    """A request that the agent or the service refuses."""


class Conflict(InvalidRequest):
    """A name already in use, such as a sandbox id."""


class TooLarge(InvalidRequest):
    """A file, archive or answer from a sandbox is over the host's limit (the message names it)."""


class AuthError(OrchardError, PermissionError):
    """A missing or wrong token or API key."""


class EngineUnavailable(OrchardError, ConnectionError):
    """The container engine or the service cannot be reached."""


class SandboxError(OrchardError, RuntimeError):
    """A sandbox failed to start or died."""


class SandboxNotReady(SandboxError, TimeoutError):
    """A sandbox did not become ready in time."""


class AgentError(OrchardError, ConnectionError):
    """The exec agent inside a sandbox did not answer."""


class Overloaded(OrchardError, RuntimeError):
    """Transient overload (HTTP 503): safe to retry later."""


class ImageNotFound(NotFound, SandboxError):
    """A sandbox's image is not in the engine (also a SandboxError: its start failed)."""

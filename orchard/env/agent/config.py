"""`AgentConfig`: what every request handler shares (the token's digest, the workdir, the shell,
the base environment of commands, the shell sessions and the listened ports)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
import threading
from _operator import _compare_digest  # hmac's, without loading libcrypto
from collections.abc import Mapping

from .processes import child_environment
from .protocol import DEFAULT_WORKDIR, MAX_LISTENERS, MAX_SESSIONS, TOKEN_SHA256_ENV, ApiError
from .shells import Shell, ShellSession
from .tunnels import Listener

try:  # the builtin SHA-256, without hashlib's libcrypto (Python 3.12 merged it into _sha2)
    from _sha2 import sha256 as _sha256
except ImportError:
    from _sha256 import sha256 as _sha256


class AgentConfig:
    """What every request handler needs: token, workdir, shell and the base child environment.

    The token is given itself (``token``) or as its hex SHA-256 (``token_sha256``), exactly one;
    only its digest is kept (``token_digest``), and a request's token is checked by its digest.
    """

    def __init__(
        self,
        token: str = "",
        workdir: str = DEFAULT_WORKDIR,
        shell: Shell | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        token_sha256: str = "",
    ) -> None:
        if bool(token) == bool(token_sha256):
            raise ValueError("give the agent token or its SHA-256, exactly one, not empty")
        self.token_digest = _sha256(token.encode()).digest() if token else parse_sha256(token_sha256)
        self.workdir = os.path.abspath(workdir)
        self.shell = shell or Shell.detect()
        self.base_env = child_environment(os.environ if environ is None else environ)
        self.sessions: dict[str, ShellSession] = {}
        self.sessions_lock = threading.Lock()
        self._private: str | None = None
        self._private_lock = threading.Lock()
        self.listeners: dict[int, Listener] = {}
        self.listeners_lock = threading.Lock()

    def authorized(self, token: str) -> bool:
        """Whether ``token`` is the agent's: their SHA-256 digests compared in constant time."""
        return _compare_digest(_sha256(token.encode()).digest(), self.token_digest)

    def session(self, name: str) -> ShellSession:
        """The persistent shell called ``name``, started on first use."""
        with self.sessions_lock:
            session = self.sessions.get(name)
            if session is None or not session.alive():
                if session is None and len(self.sessions) >= MAX_SESSIONS:
                    raise ApiError(429, f"at most {MAX_SESSIONS} shell sessions; close one (DELETE /shell)")
                session = self.sessions[name] = ShellSession(self)
            return session

    def close_session(self, name: str, only: ShellSession | None = None) -> bool:
        """Kill the shell called ``name`` (if ``only``, just when it is still that one)."""
        with self.sessions_lock:
            session = self.sessions.get(name)
            if session is None or (only is not None and session is not only):
                return False
            del self.sessions[name]
        session.kill()
        return True

    def listen(self, port: int) -> bool:
        """Listen on ``127.0.0.1:port`` for the host (see ``Listener``); False if it already does.

        409 when something else of the sandbox holds the port, 429 past ``MAX_LISTENERS``.
        """
        with self.listeners_lock:
            if port in self.listeners:
                return False
            if len(self.listeners) >= MAX_LISTENERS:
                raise ApiError(429, f"at most {MAX_LISTENERS} listened ports; close one (DELETE /listen)")
            try:
                self.listeners[port] = Listener(port)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                raise ApiError(409, f"127.0.0.1:{port} is taken in the sandbox") from None
            return True

    def listener(self, port: int) -> Listener:
        with self.listeners_lock:
            listener = self.listeners.get(port)
        if listener is None:
            raise ApiError(404, f"the agent does not listen on 127.0.0.1:{port} (POST /listen first)")
        return listener

    def unlisten(self, port: int) -> bool:
        """Stop listening on ``port`` (see ``Listener.close``); False if it did not."""
        with self.listeners_lock:
            listener = self.listeners.pop(port, None)
        if listener is None:
            return False
        listener.close()
        return True

    def private_folder(self) -> str:
        """A folder only the agent's user may use (``mkdtemp``: 0700, under ``TMPDIR`` or /tmp),
        for scripts too long to hand a shell otherwise. Made when first needed, and made again
        when what is at its path is no longer it (``lstat``: a real folder, this user's, 0700),
        so a folder another user renamed into its place is never written to. OSError when none
        can be made (a read-only or full /tmp)."""
        with self._private_lock:
            if self._private is not None:
                with contextlib.suppress(OSError):
                    info = os.lstat(self._private)
                    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700:
                        return self._private
            self._private = tempfile.mkdtemp(prefix="orchard-agent-")
            return self._private

    def resolve(self, path: str) -> str:
        """An absolute, normalised path; relative paths are relative to the workdir."""
        return os.path.normpath(os.path.join(self.workdir, path))

    def default_cwd(self) -> str:
        """The workdir, created if missing; ``/`` if it cannot be created."""
        try:
            os.makedirs(self.workdir, exist_ok=True)
        except OSError:
            return "/"
        return self.workdir if os.path.isdir(self.workdir) else "/"


def parse_sha256(text: str) -> bytes:
    """The 32 bytes of a hex SHA-256 digest (either case); ValueError naming the variable otherwise."""
    text = text.strip()
    if len(text) != 64 or not all(c in "0123456789abcdefABCDEF" for c in text):
        raise ValueError(f"{TOKEN_SHA256_ENV} must be 64 hex digits (the SHA-256 of the token)")
    return bytes.fromhex(text)

"""The agent's servers (a thread per connection, on a Unix socket or TCP), `serve` until SIGTERM,
and the command line (`main`: the token read and removed from the environment, then serve).

Security notes
--------------
The token is read from ``ORCHARD_AGENT_TOKEN`` at start-up and removed from the environment, so
commands do not inherit it; tokens are compared in constant time. Where whoever may read the
sandbox's definition must not learn the token (a Pod's spec, readable by anyone who may read
Pods), ``ORCHARD_AGENT_TOKEN_SHA256`` holds the hex SHA-256 of the token instead (removed the same
way; exactly one of the two is set), and the agent compares the SHA-256 of the token presented,
in constant time: the digest names the token without granting it. On a Unix socket the socket
file is mode 0666: access is controlled by the token and by the mode of the host folder holding
it. The token keeps out whoever can reach the socket or port but is not the host; it is no
secret from the commands themselves: one running as the agent's user can still read it from
``/proc/<agent pid>/environ``, which grants nothing it could not already do in the sandbox.
The agent authenticates its caller, nothing more: an authenticated caller can run anything the
agent's user can, read and write any file it can reach. It does not isolate commands from each
other or from itself, and it offers no confidentiality on TCP (no TLS): the sandbox (container,
network policy) is the security boundary, and a TCP port must only be published on loopback or
a trusted network.
In a Pod (``--pod POD_IP:PORT``) the agent listens at the Pod IP only, never on ``0.0.0.0``: the
Pod's loopback does not reach it, and its port on loopback is free for the sandbox's own programs
(and ``/listen``).
A port listened on for the host (``/listen``) is open to every process of the sandbox, as any
port of its loopback is, and what they send there reaches whatever the host carries it to; the
agent never connects anywhere for it, and nothing it answers names an address: the host decides
where the bytes go (``Sandbox.expose``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import socketserver
import sys

from .config import AgentConfig
from .handler import AgentHandler
from .protocol import DEFAULT_WORKDIR, TOKEN_ENV, TOKEN_SHA256_ENV

TYPE_CHECKING = False  # the typing module is not imported at run time (see the module closure)
if TYPE_CHECKING:
    from typing import NoReturn


class AgentServer(socketserver.ThreadingMixIn, socketserver.BaseServer):
    """Shared behaviour of the Unix and TCP servers: a thread per connection, quiet errors."""

    daemon_threads = True
    request_queue_size = 4096  # the kernel caps it at net.core.somaxconn: a burst of connections is queued
    agent: AgentConfig

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError | TimeoutError):
            print(f"orchard-agent: connection failed: {exc!r}", file=sys.stderr)


class UnixAgentServer(AgentServer, socketserver.UnixStreamServer):
    """Listens on a Unix socket."""


class TCPAgentServer(AgentServer, socketserver.TCPServer):
    """Listens on TCP, with Nagle's algorithm off on every connection."""

    allow_reuse_address = True

    def get_request(self) -> tuple[socket.socket, object]:
        conn, address = self.socket.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, address


class TCP6AgentServer(TCPAgentServer):
    """Listens on TCP over IPv6."""

    address_family = socket.AF_INET6


def make_server(config: AgentConfig, *, unix: str | None = None, tcp: tuple[str, int] | None = None) -> AgentServer:
    """A bound, listening server (not yet serving). Exactly one of ``unix`` and ``tcp``."""
    if (unix is None) == (tcp is None):
        raise ValueError("give exactly one of unix= and tcp=")
    server: AgentServer
    if unix is not None:
        server = _bind_unix(unix)
    else:
        assert tcp is not None
        host = tcp[0].strip("[]")
        server_class = TCP6AgentServer if ":" in host else TCPAgentServer
        server = server_class((host, tcp[1]), AgentHandler)
    server.agent = config
    return server


def pod_host(pod_ip: str) -> str:
    """The address the agent listens at in a Pod whose IP is `pod_ip` (the Downward API's `status.podIP`).

    The Pod IP itself, where it is one of the Pod's own addresses (on any real node). A loopback
    `pod_ip` is a node that reaches its Pods through a forward from its own loopback (the test
    kubelet publishes each Pod's ports on 127.0.0.N of the host, which Docker forwards to the
    container's interface): it stands for this network namespace's own non-loopback IPv4 address,
    where that forward lands; never for loopback itself, unless the namespace has nothing else.
    """
    host = pod_ip.strip("[]")
    if not _loopback(host):
        return host
    return next(iter(_interface_addresses()), host)


def _loopback(host: str) -> bool:
    return host == "::1" or host.startswith("127.") or host == "localhost"


def _interface_addresses() -> list[str]:
    """The IPv4 addresses of this network namespace's interfaces other than loopback, in interface order."""
    import fcntl
    import struct

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            address = socket.inet_ntoa(answer[20:24])
            if not _loopback(address):
                found.append(address)
    return found


SIOCGIFADDR = 0x8915
"""The ioctl that reads an interface's IPv4 address (linux/sockios.h)."""


def _bind_unix(path: str) -> UnixAgentServer:
    """Bind and listen on a temporary name, chmod 0666, then rename it onto ``path``.

    The rename replaces a stale socket from an earlier run, and clients waiting for ``path`` to
    appear always find a listening socket with its final mode. Where a socket on a host folder
    can be neither chmodded nor renamed (gVisor's host-UDS), it is bound in place with mode 0666.
    """
    temp = f"{path}.new"
    _remove_socket(temp)
    server = UnixAgentServer(temp, AgentHandler)
    try:
        os.chmod(temp, 0o666)
        os.replace(temp, path)
    except PermissionError:  # a host socket that can only be bound (nor unlinked, nor stat-ed)
        server.server_close()
        mask = os.umask(0o111)
        try:
            return UnixAgentServer(path, AgentHandler)
        finally:
            os.umask(mask)
    except OSError:
        server.server_close()
        _remove_socket(temp)
        raise
    server.server_address = path
    return server


def serve(config: AgentConfig, *, unix: str | None = None, tcp: tuple[str, int] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then remove the Unix socket file. The stop is handled from
    before the socket appears: one that comes while it is bound waits until it can be removed."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    stops = {signal.SIGTERM, signal.SIGINT}
    for signum in stops:
        signal.signal(signum, stop)
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        server = make_server(config, unix=unix, tcp=tcp)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        server.serve_forever(poll_interval=None)  # type: ignore[arg-type]
    finally:
        server.server_close()
        if unix is not None:
            _remove_socket(unix)


def _remove_socket(path: str) -> None:
    with contextlib.suppress(FileNotFoundError, PermissionError):
        os.unlink(path)


# -- command line --------------------------------------------------------------------------

USAGE = "usage: agent/__main__.py (--unix PATH | --tcp HOST:PORT | --pod POD_IP:PORT) [--workdir DIR]"


def parse_args(argv: list[str]) -> dict[str, str]:
    """``--unix``, ``--tcp``, ``--pod`` and ``--workdir`` (``--name value`` or ``--name=value``).

    ``--pod POD_IP:PORT`` is ``--tcp`` at the Pod's own address (`pod_host`), never ``0.0.0.0``.
    """
    options: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        name, has_value, value = arg.partition("=")
        if name not in ("--unix", "--tcp", "--pod", "--workdir"):
            fail(f"unknown argument {arg!r}")
        if not has_value:
            value = next(args, "")
        if not value:
            fail(f"{name} needs a value")
        options[name[2:]] = value
    if sum(mode in options for mode in ("unix", "tcp", "pod")) != 1:
        fail("give exactly one of --unix, --tcp and --pod")
    return options


def parse_tcp(address: str, option: str = "--tcp") -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        fail(f"{option} must be HOST:PORT, not {address!r}")
    return host, int(port)


def fail(message: str) -> NoReturn:
    print(f"orchard-agent: {message}\n{USAGE}", file=sys.stderr)
    raise SystemExit(2)


PR_SET_DUMPABLE = 4


def not_dumpable() -> bool:
    """Make this process non-dumpable, so that the commands it runs (its own user's, with no
    CAP_SYS_PTRACE) can neither attach to it nor open its memory, descriptors or environment under
    `/proc`: no command can rewrite what the agent tells the host. A command's own process is
    dumpable again once it has `exec`ed. False where it cannot be done (no ctypes, not Linux)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Start the agent: made non-dumpable, read (and remove) the token, bind, serve until SIGTERM or SIGINT."""
    not_dumpable()
    options = parse_args(sys.argv[1:] if argv is None else argv)
    token = os.environ.pop(TOKEN_ENV, "")
    token_sha256 = os.environ.pop(TOKEN_SHA256_ENV, "")
    if not token and not token_sha256:
        fail(f"{TOKEN_ENV} (or {TOKEN_SHA256_ENV}) is not set: the agent refuses to start without a token")
    if token and token_sha256:
        fail(f"both {TOKEN_ENV} and {TOKEN_SHA256_ENV} are set: set one")
    try:
        config = AgentConfig(token, options.get("workdir", DEFAULT_WORKDIR), token_sha256=token_sha256)
    except ValueError as exc:
        fail(str(exc))
    tcp = parse_tcp(options["tcp"]) if "tcp" in options else None
    if "pod" in options:
        pod_ip, port = parse_tcp(options["pod"], "--pod")
        tcp = (pod_host(pod_ip), port)
    try:
        serve(config, unix=options.get("unix"), tcp=tcp)
    except OSError as exc:
        print(f"orchard-agent: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0

"""Connections carried between the host and the sandbox's loopback: ports the agent listens on
for the host (`Listener`: ``POST /listen``, ``/accept``) and the byte splice of a tunnel (`splice`,
also for ``/connect``)."""

from __future__ import annotations

import contextlib
import io
import selectors
import socket
import threading
import time
from collections.abc import Callable

from .protocol import TUNNEL_BACKLOG, ApiError

TUNNEL_POLL_S = 1.0  # a waiting /accept looks at its listener's state at least this often
TUNNEL_CHUNK = 256 * 1024


class Listener:
    """A port of the sandbox's loopback that the host listens on through the agent (``POST /listen``).

    Connections made to it wait in the kernel's accept queue (at most ``TUNNEL_BACKLOG``; past
    that the kernel answers no more, and the client's connect retries) until an ``/accept`` of
    the host takes one. Nothing is accepted on the host's behalf when it is not asking, so no
    connection of the sandbox waits in the agent. ``close`` (``DELETE /listen``) shuts the
    socket down first, which refuses new connections, resets those queued and wakes every
    waiting ``/accept``; the descriptor is closed once the last of them has left it, so none
    waits on a number the system has given to another file.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT; never a 2nd listener
            self.sock.bind(("127.0.0.1", port))
            self.sock.listen(TUNNEL_BACKLOG)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.lock = threading.Lock()
        self.closed = False
        self.users = 0

    def accept(self, caller: socket.socket, deadline: float) -> socket.socket | None:
        """The next connection made to the port, or None when none came by ``deadline``.

        ``caller`` is the host's connection: when it becomes readable (the host hung up; it
        sends nothing while it waits) the wait ends with ConnectionResetError, and no
        connection is taken for a host that is gone. 404 once the listener is closed.
        """
        with self.lock:
            if self.closed:
                raise self.not_listening()
            self.users += 1
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.sock, selectors.EVENT_READ)
                selector.register(caller, selectors.EVENT_READ)
                while not self.closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    events = selector.select(min(remaining, TUNNEL_POLL_S))
                    if any(key.fileobj is caller for key, _ in events):
                        raise ConnectionResetError("the host hung up while waiting for a connection")
                    if self.closed or not events:
                        continue
                    try:
                        conn, _ = self.sock.accept()
                    except BlockingIOError:  # another /accept took it first
                        continue
                    except OSError:
                        if self.closed:
                            break
                        raise
                    conn.setblocking(True)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return conn
                raise self.not_listening()
        finally:
            self.release()

    def not_listening(self) -> ApiError:
        return ApiError(404, f"the agent does not listen on 127.0.0.1:{self.port} (POST /listen first)")

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            last = self.closed and not self.users
        if last:
            self.sock.close()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            idle = not self.users
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # refuses new connections, wakes the waiters
        if idle:
            self.sock.close()


def splice(host: socket.socket, host_reader: io.BufferedIOBase, sandbox: socket.socket) -> None:
    """Bytes both ways between the host's connection and one of the sandbox, until both ends are done.

    The end of one direction (EOF) is passed on as ``shutdown(SHUT_WR)``, so a client that
    half-closes still gets its answer; a broken connection ends both directions. The host's
    side is read through its buffered reader, which may already hold the first bytes.
    """
    back = threading.Thread(target=carry, args=(sandbox.recv, host, sandbox), name="tunnel-back", daemon=True)
    back.start()
    try:
        carry(host_reader.read1, sandbox, host)
    finally:
        back.join()
        sandbox.close()


def carry(read: Callable[[int], bytes], dest: socket.socket, source: socket.socket) -> None:
    """One direction of ``splice``: what ``read`` gives, to ``dest``; at EOF, ``dest`` is shut for writing."""
    try:
        while chunk := read(TUNNEL_CHUNK):
            dest.sendall(chunk)
        dest.shutdown(socket.SHUT_WR)
    except OSError:  # one side broke: end the other direction too
        for sock in (dest, source):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

"""A hostile HTTP client for the tests of servers that must not trust theirs (the service, the proxy)."""

from __future__ import annotations

import select
import socket

MiB = 2**20


def send_chunked(port: int, path: str, headers: dict[str, str], total: int) -> tuple[int | None, int]:
    """POST `total` bytes as a chunked body, made lazily, until the server answers.

    The status it answered (None if it cut the connection without one) and the bytes of body
    the server took before that: a server that reads the body before answering takes them all.
    """
    lines = ["POST " + path + " HTTP/1.1", "Host: 127.0.0.1", "Transfer-Encoding: chunked"]
    lines += ["Content-Type: application/json", *(f"{k}: {v}" for k, v in headers.items())]
    chunk = b"%x\r\n" % MiB + b"A" * MiB + b"\r\n"  # one buffer sent again and again
    view, offset, sent = memoryview(chunk), 0, 0
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        s.setblocking(False)
        while sent < total:
            readable, writable, _ = select.select([s], [s], [], 60)
            if readable or not writable:  # it answered, or stopped reading for a minute
                break
            try:
                n = s.send(view[offset:])
            except BlockingIOError:
                continue
            except OSError:  # it closed the connection
                break
            sent, offset = sent + n, (offset + n) % len(chunk)
        s.setblocking(True)
        s.settimeout(300)
        try:
            if sent >= total:
                s.sendall(b"0\r\n\r\n")
            answer = s.recv(4096)
        except OSError:
            return None, sent
    status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/1.1 ") else b""
    return (int(status) if status.isdigit() else None), sent

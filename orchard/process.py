"""Process identity on this host: who owns a sandbox or a run, and whether that process still runs.

An owner string names one process uniquely over time (host, pid and start time), so a pid reused
by another process does not pass for the owner. The environment layer labels sandboxes with it
and the store marks runs with it; both judge leftovers by `owner_alive`. A leaf module: it imports
nothing of Orchard.
"""

from __future__ import annotations

import os
import socket


def process_owner(pid: int | None = None) -> str:
    """An owner string naming this process uniquely over time: host, pid and start time."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def owner_alive(owner: str) -> bool:
    """False only when `owner` names a process of this host that is gone (pid reuse included)."""
    host, _, rest = owner.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return True  # not ours to judge: another host, or a named owner such as a service
    return _start_time(int(pid_text)) == started != ""


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as dead)."""
    fields = _stat(pid) if pid > 0 else None
    return fields is not None and fields[0] != b"Z"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' if no such process)."""
    fields = _stat(pid)
    return "" if fields is None else fields[19].decode()


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name, from the state on (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(b")", 1)[1].split()

"""Warm pools: K started sandboxes kept ready per spec, so acquiring one is a local hand-over.

RL rollouts and evaluations start many short-lived sandboxes of a few images. Starting one takes
hundreds of milliseconds (most of it the engine's); taking one from a pool takes a dictionary
pop. A background thread refills each pool to its size, a few creations at a time. A spec's
`init` runs before a sandbox joins its pool (`SandboxManager.wait_ready`), so what waits there is
started through and through (a browser already running, say).

A pool shrinks when asked to (`warm(spec, size, drain=True)`): the ready sandboxes beyond the new
size are deleted at once, and those still starting are deleted as they come up, so a run that
is done with its pools leaves none of their sandboxes behind.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from orchard.env.backends.base import SandboxSpec
from orchard.errors import InvalidRequest, OrchardError

if TYPE_CHECKING:
    from orchard.env.manager import SandboxInfo, SandboxManager

log = logging.getLogger("orchard.env.pool")

MAX_POOL_SIZE = 256
REFILL_CONCURRENCY = 4
REFILL_PAUSE, MAX_REFILL_PAUSE = 5.0, 300.0
"""Seconds between refill rounds when nothing wakes the refiller; longer while starts fail."""
"""Creations a refill runs at once (the engine serialises much of the work anyway)."""


PoolKey = tuple


def pool_key(spec: SandboxSpec) -> PoolKey:
    """Specs that differ only in who asks for them (owner, run) share a pool."""
    return (
        spec.image,
        spec.network,
        spec.cpu,
        spec.memory_bytes,
        spec.pids,
        spec.disk_bytes,
        tuple(sorted(spec.tmpfs.items())),
        spec.ttl,
        spec.workdir,
        tuple(sorted(spec.env.items())),
        spec.init,
        spec.tools,
    )


class WarmPools:
    """The warm pools of one manager. Thread-safe."""

    def __init__(self, manager: SandboxManager):
        self.manager = manager
        self._specs: dict[PoolKey, SandboxSpec] = {}
        self._sizes: dict[PoolKey, int] = {}
        self._ready: dict[PoolKey, deque[str]] = {}
        self._starting: dict[PoolKey, int] = {}
        self._draining: set[PoolKey] = set()
        """Pools whose sandboxes beyond their size are deleted (`warm(..., drain=True)`), not kept."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._workers = ThreadPoolExecutor(REFILL_CONCURRENCY, thread_name_prefix="orchard-pool")
        self._thread: threading.Thread | None = None
        self._pause = REFILL_PAUSE

    def warm(self, spec: SandboxSpec, size: int, *, drain: bool = False) -> list[str]:
        """Keep `size` sandboxes of `spec` ready (0 stops refilling; ready ones stay until used).

        With `drain`, the pool holds no more than `size` from now on: the ready sandboxes beyond
        it are deleted now (their ids returned), and those still starting as they come up.
        """
        if not 0 <= size <= MAX_POOL_SIZE:
            raise InvalidRequest(f"a pool size is 0 to {MAX_POOL_SIZE}, not {size}")
        key = pool_key(spec)
        surplus: list[str] = []
        with self._lock:
            self._specs[key] = replace(spec, run_id=None)
            self._sizes[key] = size
            ready = self._ready.setdefault(key, deque())
            self._starting.setdefault(key, 0)
            if drain:
                self._draining.add(key)
                while len(ready) > size:
                    surplus.append(ready.pop())
            else:
                self._draining.discard(key)
            if self._thread is None and size:
                self._thread = threading.Thread(target=self._refill_forever, daemon=True, name="orchard-pools")
                self._thread.start()
        self._wake.set()
        for sandbox_id in surplus:
            self._delete(sandbox_id)
        return surplus

    def acquire(self, spec: SandboxSpec) -> SandboxInfo | None:
        """A ready sandbox of `spec` from its pool, or None when the pool is empty or absent."""
        key = pool_key(spec)
        while True:
            with self._lock:
                ready = self._ready.get(key)
                if not ready:
                    return None
                sandbox_id = ready.popleft()
            self._wake.set()
            try:
                info = self.manager.get(sandbox_id)
            except OrchardError:  # reaped or deleted while it waited: take the next one
                continue
            if time.time() - info.created_at > info.spec.ttl / 2:  # its TTL runs from its start
                self.manager.delete(sandbox_id)
                continue
            return info

    def sizes(self) -> list[tuple[SandboxSpec, int, int]]:
        """Each pool's spec, wanted size and ready count."""
        with self._lock:
            return [(self._specs[key], size, len(self._ready[key])) for key, size in self._sizes.items()]

    def starting(self) -> int:
        """How many pooled sandboxes are being started now, in all pools (a drained pool's too,
        until they are up and deleted again)."""
        with self._lock:
            return sum(self._starting.values())

    def give_up(self) -> list[str]:
        """The ids of the pooled sandboxes not handed out, which the pools no longer hold."""
        with self._lock:
            ids = [sandbox_id for ready in self._ready.values() for sandbox_id in ready]
            for ready in self._ready.values():
                ready.clear()
        return ids

    def close(self) -> None:
        """Stop refilling (the manager deletes the pooled sandboxes with the rest)."""
        self._closed.set()
        self._wake.set()
        self._workers.shutdown(wait=True, cancel_futures=True)

    def _refill_forever(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(timeout=self._pause)
            self._wake.clear()
            for key, missing in self._deficits():
                for _ in range(missing):
                    try:
                        self._workers.submit(self._add, key)
                    except RuntimeError:  # closed meanwhile
                        return

    def _deficits(self) -> list[tuple[PoolKey, int]]:
        with self._lock:
            out = []
            for key, size in self._sizes.items():
                missing = size - len(self._ready[key]) - self._starting[key]
                if missing > 0:
                    self._starting[key] += missing
                    out.append((key, missing))
            return out

    def _add(self, key: PoolKey) -> None:
        info = None
        with self._lock:  # queued a while: the pool may have shrunk since
            wanted = len(self._ready[key]) + self._starting[key] - 1 < self._sizes[key]
            if not wanted:
                self._starting[key] -= 1
        if not wanted:
            return
        try:
            if not self._closed.is_set():
                info = self.manager.create(self._specs[key])
        except Exception:  # a failed start is in the store; the next wake tries again
            log.warning("could not start a pooled sandbox of %s", key[0], exc_info=True)
        with self._lock:
            if info is None:  # back off while starts fail (a missing image, say)
                self._pause = min(self._pause * 2, MAX_REFILL_PAUSE)
                self._starting[key] -= 1
                return
            self._pause = REFILL_PAUSE
            if not (key in self._draining and len(self._ready[key]) >= self._sizes[key]):
                self._ready[key].append(info.sandbox_id)
                self._starting[key] -= 1
                return
        try:  # the pool shrank while it started; it counts as starting until it is gone
            self._delete(info.sandbox_id)
        finally:
            with self._lock:
                self._starting[key] -= 1
            self._wake.set()

    def _delete(self, sandbox_id: str) -> None:
        try:
            self.manager.delete(sandbox_id)
        except OrchardError:  # gone already, or the engine is away: the manager's close and reaper end it
            log.warning("could not delete pooled sandbox %s", sandbox_id, exc_info=True)

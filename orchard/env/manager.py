"""Sandbox lifecycle: create, wait until the agent answers, track, reap, delete.

The manager owns sandboxes for one process (an SDK user or the `orchard up` service). It asks
the backend to start containers, waits for the injected agent's health check over the direct
route, then has the backend seal what the sandbox could still write on the host (`seal`: its
run folder), records everything in the store, and reaps: expired sandboxes (older than their
TTL) and orphans (labelled with an owner process of this host that is gone) are deleted when it
starts and then periodically. Commands never pass through here: callers talk to `info.endpoint`
directly (the one exception is a spec's `init`, run once by `wait_ready` before the sandbox is ready).

A fleet (`Fleet`: `orchard up --fleet NAME`, several replicas of the service sharing one store)
owns its sandboxes as a whole: the owner is `fleet:NAME`, each sandbox's agent token is derived
from the fleet's secret, the sandbox id and a nonce drawn at each create that the backend keeps
with the sandbox (`token_nonce`: a Pod's annotation), so every replica can compute it, no store or
Pod holds it, and an id created again gets a new token (one learned from an earlier sandbox of
that id opens nothing); a sandbox one replica created is taken over (`get` adopts it from the
store and the backend) by any other that is asked about it, and a replica that stops leaves the
fleet's sandboxes running. Each replica beats in the store (`beat`); the commands of one that stopped
beating are failed by the others (`fail_jobs_of_silent_replicas`).

A manager is made, then started (`start()`: connect to the backend, reap, recover what crashed
owners left in the store, start its threads), then closed; made but not started, it has done
nothing and refuses to create sandboxes.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import logging
import math
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel
from sqlmodel import col, select

from orchard import store as records
from orchard.env.agent.protocol import HEALTH_ROUTE
from orchard.env.backends import AgentEndpoint, Backend, BackendConfig, SandboxSpec, backend_config
from orchard.env.backends.base import BackendSandbox, check_sandbox_id, is_sandbox_id
from orchard.env.calls import AgentCalls, Call, send
from orchard.env.pool import WarmPools
from orchard.env.transport import AgentChannel, AsyncAgentChannel
from orchard.errors import AgentError, Conflict, NotFound, OrchardError, SandboxError, SandboxNotReady
from orchard.process import owner_alive, process_owner
from orchard.store import Store

Status = Literal["pending", "ready", "failed", "deleted"]
LIVE = ("pending", "ready")

log = logging.getLogger("orchard.env")


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the manager knows it."""

    sandbox_id: str
    spec: SandboxSpec
    endpoint: AgentEndpoint | None
    status: Status
    created_at: float
    status_message: str | None = None
    ready_at: float | None = None

    @property
    def ready(self) -> bool:
        return self.status == "ready"


@dataclass(frozen=True)
class Fleet:
    """Replicas of one service sharing a store and a secret (the service's API key): see the module."""

    name: str
    secret: str = field(repr=False)
    beat_seconds: float = 5.0
    """How often a replica beats in the store (from a thread of its own)."""

    @property
    def owner(self) -> str:
        return f"fleet:{self.name}"

    def token(self, sandbox_id: str, nonce: str = "") -> str:
        """The agent token of a sandbox of this fleet: HMAC-SHA256 of its id and the nonce of its
        create (none: a sandbox from before nonces) under the secret."""
        message = f"orchard-agent-token\0{self.name}\0{sandbox_id}".encode()
        if nonce:
            message += f"\0{nonce}".encode()
        return hmac.new(self.secret.encode(), message, hashlib.sha256).hexdigest()


def new_sandbox_id() -> str:
    """A random id of 12 hex digits (any valid id works: the host reaches an agent's socket through a pinned fd, not its path)."""
    return secrets.token_hex(6)


class SandboxManager:
    """Creates, tracks, reaps and deletes the sandboxes of one owner. Thread-safe.

    The constructor only takes the settings; `start()` does the work (the `with` statement
    starts the manager too).
    """

    def __init__(
        self,
        backend: Backend | BackendConfig | str = "docker",
        *,
        owner: str | None = None,
        store: Store | None = None,
        reap_interval: float | None = 60.0,
        fleet: Fleet | None = None,
    ):
        self._backend_choice = backend_config(backend) if isinstance(backend, str) else backend
        self._backend: Backend | None = None
        self.fleet = fleet
        self.process = process_owner()
        """This process, as the store names the runner of a command."""
        self.owner = fleet.owner if fleet else owner or self.process
        self.store = store or Store.open()
        self.reap_interval = reap_interval
        """Seconds between reaping rounds after the start (None: only at the start)."""
        self._sandboxes: dict[str, SandboxInfo] = {}
        self._deleting: set[str] = set()
        self._beats_seen: dict[str, tuple[float, float]] = {}
        """Each fleet replica's last beat as read, and when (monotonic) this replica saw it change."""
        self._last_look = -math.inf
        """Ids being deleted right now (a fleet's `get` must not adopt them back meanwhile)."""
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._started = False
        self._closed = threading.Event()
        self._recorder = _ExecRecorder(self.store, runner=self.process)
        self.reaped_at_start: builtins.list[str] = []
        """Ids of the expired and orphaned sandboxes removed when this manager started."""
        self.pools = WarmPools(self)
        """Warm pools of ready sandboxes (none until `pools.warm` is called)."""
        self.recovered_at_start = 0
        """How many store rows left behind by dead owners (a crash) were closed at start."""

    def start(self) -> SandboxManager:
        """Connect to the backend and the store, reap, recover, start the reaper; idempotent. Returns self.

        Reaping removes what dead owners and expired TTLs left in the engine (`reaped_at_start`);
        recovery closes what they left open in the store (`recovered_at_start`).
        """
        with self._start_lock:
            if self._closed.is_set():
                raise SandboxError("this sandbox manager is closed; make a new one")
            if self._started:
                return self
            if self._backend is None:
                choice = self._backend_choice
                self._backend = choice.build() if isinstance(choice, BaseModel) else choice
            self.store.engine()
            self.reaped_at_start = self.reap()
            self.recovered_at_start = self.recover()
            self._recorder.start()
            if self.fleet is not None:
                self.beat()
                threading.Thread(target=self._beat_forever, daemon=True, name="orchard-fleet-beat").start()
            if self.reap_interval:
                threading.Thread(
                    target=self._reap_forever, args=(self.reap_interval,), daemon=True, name="orchard-reaper"
                ).start()
            self._started = True
        return self

    @property
    def backend(self) -> Backend:
        """The backend sandboxes live in (connected by `start()`)."""
        if self._backend is None:
            raise SandboxError("this sandbox manager is not started; call its start() first")
        return self._backend

    # -- lifecycle --------------------------------------------------------------------

    def create(self, spec: SandboxSpec, *, sandbox_id: str | None = None, timeout: float = 120.0) -> SandboxInfo:
        """Start a sandbox and wait until its agent answers; on failure nothing is left behind."""
        info = self.launch(spec, sandbox_id=sandbox_id)
        return self.wait_ready(info.sandbox_id, timeout=timeout)

    def acquire(self, spec: SandboxSpec, *, timeout: float = 120.0) -> SandboxInfo:
        """A ready sandbox of `spec`: from its warm pool if one waits there, else a new one."""
        pooled = self.pools.acquire(spec)
        if pooled is not None:
            return self.claim(pooled, spec.run_id)
        info = self.launch(spec)
        return self.wait_ready(info.sandbox_id, timeout=timeout)

    def launch(self, spec: SandboxSpec, *, sandbox_id: str | None = None) -> SandboxInfo:
        """Ask the backend for the sandbox and return it `pending` (the agent may not answer yet)."""
        if not self._started:
            raise SandboxError("this sandbox manager is not started; call its start() first")
        sandbox_id = check_sandbox_id(sandbox_id) if sandbox_id is not None else new_sandbox_id()
        spec = replace(spec, owner=self.owner)
        with self._lock:
            if sandbox_id in self._sandboxes:
                raise Conflict(f"sandbox id {sandbox_id!r} is already in use; pick another or omit it")
            info = SandboxInfo(sandbox_id, spec, None, "pending", time.time())
            self._sandboxes[sandbox_id] = info
        nonce = secrets.token_hex(16) if self.fleet is not None and self._binds_tokens() else ""
        token = self.fleet.token(sandbox_id, nonce) if self.fleet else secrets.token_urlsafe(24)
        try:
            if nonce:  # the backend keeps it with the sandbox, for every replica to derive the token
                create: Callable[..., AgentEndpoint] = self.backend.create
                endpoint = create(sandbox_id, spec, token, nonce=nonce)
            else:
                endpoint = self.backend.create(sandbox_id, spec, token)
        except Conflict:  # someone else's sandbox: neither touch it nor its record
            with self._lock:
                self._sandboxes.pop(sandbox_id, None)
            raise
        except Exception as exc:  # the backend removed what it made; keep a `failed` record
            self._discard(sandbox_id, str(exc), remove=False)
            raise
        try:
            return self._update(sandbox_id, endpoint=endpoint)
        except NotFound:  # deleted while the backend was creating it
            self.backend.delete(sandbox_id, self.owner)
            raise

    def wait_ready(self, sandbox_id: str, *, timeout: float = 120.0) -> SandboxInfo:
        """Block until the agent answers its health check, then run the spec's `init` (if any);
        a dead container fails at once, and so does a failing init.

        An endpoint without an address yet (`url` "" and no socket: a Pod before it has an IP) is
        first resolved from the backend's state (`address`), waiting while it is `starting`.
        """
        info = self.get(sandbox_id)
        if info.status != "pending":
            return self._raise_if_failed(info)
        assert info.endpoint is not None
        deadline = time.monotonic() + timeout
        if not (info.endpoint.url or info.endpoint.uds):
            address = self._agent_address(sandbox_id, deadline, timeout)
            info = self._update(sandbox_id, endpoint=replace(info.endpoint, url=address))
        assert info.endpoint is not None
        with agent_http(info.endpoint, timeout=2.0) as http:
            delay, next_state_check = 0.002, time.monotonic() + 0.2
            while not _answers(http, info.endpoint):
                self.get(sandbox_id)  # NotFound once deleted meanwhile
                now = time.monotonic()
                if now >= next_state_check:
                    next_state_check = now + 0.5
                    state = self.backend.state(sandbox_id)
                    if not state.running and not state.starting:
                        return self._fail(sandbox_id, f"sandbox {sandbox_id} did not start: {state.message}")
                if now >= deadline:
                    self._discard(sandbox_id, f"the agent of sandbox {sandbox_id} did not answer within {timeout:g} s")
                    raise SandboxNotReady(f"sandbox {sandbox_id} was not ready within {timeout:g} s")
                time.sleep(delay)
                delay = min(delay * 1.5, 0.05)
        try:
            self.backend.seal(sandbox_id)  # before any command runs; it checks what the start left there
        except SandboxError as exc:
            return self._fail(sandbox_id, str(exc))
        if info.spec.init is not None:
            self._run_init(info)
        return self._update(sandbox_id, status="ready", ready_at=time.time())

    def _run_init(self, info: SandboxInfo) -> None:
        """Run the spec's `init` through the agent while the sandbox is still `pending`. One that
        fails (a non-zero exit, its timeout, an agent that does not answer) fails the sandbox: it
        is deleted, and SandboxError says why, with the tail of the command's output."""
        init, spec, started = info.spec.init, info.spec, time.time()
        assert info.endpoint is not None and init is not None
        call = AgentCalls().exec(init, timeout=spec.init_timeout, max_output=INIT_OUTPUT)
        try:
            with agent_http(info.endpoint) as channel:
                result = send(channel, call)
        except AgentError as exc:
            why = f"could not run: {exc}"
        else:
            self.record_exec(info.sandbox_id, init, result, started)
            if result.ok:
                return
            if result.exit_code is None:
                why = f"could not run: {result.error}"
            elif result.timed_out:
                why = f"timed out after {spec.init_timeout:g} s"
            else:
                why = f"exited {result.exit_code}"
            tail = (result.stdout + result.stderr).strip()[-INIT_TAIL:]
            why += f"; its output ends: {tail}" if tail else ""
        self._fail(info.sandbox_id, f"the init command of sandbox {info.sandbox_id} {why}")

    def _agent_address(self, sandbox_id: str, deadline: float, timeout: float) -> str:
        """The agent's base URL once the backend knows it (`SandboxState.address`).

        Waits while the sandbox is `starting`; a failure (neither running nor starting) fails the
        sandbox at once with the backend's reason. Between looks it waits on the backend's
        `wait_for_change(sandbox_id, state, seconds)` where it has one (a watch wakes it), else
        sleeps a few milliseconds: `state` is meant to be cheap (a cache), not an API call.
        """
        wait_for_change = getattr(self.backend, "wait_for_change", None)
        delay = 0.002
        while True:
            self.get(sandbox_id)  # NotFound once deleted meanwhile
            state = self.backend.state(sandbox_id)
            if state.address:
                return state.address
            if not state.running and not state.starting:
                self._fail(sandbox_id, f"sandbox {sandbox_id} did not start: {state.message}")  # raises
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._discard(
                    sandbox_id, f"sandbox {sandbox_id} had no agent address within {timeout:g} s: {state.message}"
                )
                raise SandboxNotReady(f"sandbox {sandbox_id} was not ready within {timeout:g} s: {state.message}")
            if wait_for_change is not None:
                wait_for_change(sandbox_id, state, min(remaining, 0.5))
            else:
                time.sleep(min(delay, remaining))
                delay = min(delay * 1.5, 0.05)

    def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox of this owner; idempotent (also for ids already gone).

        NotFound for a container of that name that is not this owner's sandbox (left alone).
        One this manager does not hold (another manager of the owner started it: a tool such as
        the dashboard acts for the owner) has its live record in the store marked deleted too.
        """
        check_sandbox_id(sandbox_id)
        with self._lock:  # first: from here on no check marks it failed, nothing hands it out
            known = self._sandboxes.pop(sandbox_id, None)
            self._deleting.add(sandbox_id)  # nor adopts it again
        try:
            try:
                self.backend.delete(sandbox_id, self.owner)
            except BaseException:
                if known is not None:
                    with self._lock:
                        self._sandboxes.setdefault(sandbox_id, known)
                raise
            if known is not None:
                self._save(replace(known, status="deleted"), deleted_at=time.time())
            else:
                self._close_record(sandbox_id)
        finally:
            with self._lock:
                self._deleting.discard(sandbox_id)

    def get(self, sandbox_id: str) -> SandboxInfo:
        """The sandbox `sandbox_id` of this manager (of a fleet: adopted when another replica made it)."""
        with self._lock:
            info = self._sandboxes.get(sandbox_id)
        if info is None and self.fleet is not None:
            info = self._adopt(sandbox_id)
        if info is None:
            raise NotFound(f"no sandbox {sandbox_id!r}; `orchard sandbox ls` lists the live ones")
        return info

    def _adopt(self, sandbox_id: str) -> SandboxInfo | None:
        """A live sandbox of this fleet that this manager does not hold, taken into its hands.

        The store says it is the fleet's and live; the backend says where its agent is (a Pod still
        starting has no address yet: `wait_ready` resolves it). One the backend reports failed or
        gone is recorded so, and not adopted.
        """
        assert self.fleet is not None
        with self._lock:
            if sandbox_id in self._deleting:
                return None
        recorded = self.recorded(sandbox_id) if is_sandbox_id(sandbox_id) else None
        if recorded is None or recorded.status not in LIVE or recorded.spec.owner != self.owner:
            return None
        state = self.backend.state(sandbox_id)
        if not (state.running or state.starting):  # failed or gone: removed, and recorded so
            if state.exists:
                self.backend.delete(sandbox_id, self.owner)
            status: Status = "failed" if state.exists else "deleted"
            message = f"sandbox {sandbox_id} stopped: {state.message}" if state.exists else "its Pod is gone"
            self._save(replace(recorded, status=status, status_message=message), deleted_at=time.time())
            return None
        token_nonce = getattr(self.backend, "token_nonce", None)
        nonce = token_nonce(sandbox_id) if callable(token_nonce) else ""
        if nonce is None:  # gone since the look at its state
            return None
        endpoint = AgentEndpoint(token=self.fleet.token(sandbox_id, nonce), url=state.address or "")
        with self._lock:
            return self._sandboxes.setdefault(sandbox_id, replace(recorded, endpoint=endpoint))

    def _binds_tokens(self) -> bool:
        """Whether the backend keeps a nonce with each sandbox (`token_nonce`), that a fleet's tokens are derived from."""
        return callable(getattr(self.backend, "token_nonce", None))

    def claim(self, pooled: SandboxInfo, run_id: str | None) -> SandboxInfo:
        """A sandbox handed over from a pool now belongs to `run_id`."""
        return self._update(pooled.sandbox_id, spec=replace(pooled.spec, run_id=run_id))

    def knows(self, sandbox_id: str) -> bool:
        """Whether this manager still holds the sandbox (it may have been reaped)."""
        with self._lock:
            return sandbox_id in self._sandboxes

    def check_alive(self, sandbox_id: str) -> SandboxInfo:
        """The sandbox, after asking the engine: one whose container died is failed (and removed)."""
        info = self.get(sandbox_id)
        if info.status == "ready":
            state = self.backend.state(sandbox_id)
            if not state.running:
                return self._discard(sandbox_id, f"sandbox {sandbox_id} stopped: {state.message}")
        return info

    def recorded(self, sandbox_id: str) -> SandboxInfo | None:
        """The sandbox as the store last recorded it, live or not (None if never seen)."""
        with records.session(self.store) as db:
            record = db.get(records.SandboxRecord, check_sandbox_id(sandbox_id))
        return None if record is None else _info_of(record)

    def list(self) -> list[SandboxInfo]:
        """Sandboxes of this manager, oldest first; of a fleet, every replica's (from the store)."""
        with self._lock:
            held = dict(self._sandboxes)
        if self.fleet is not None:  # what the store has live (a copy held here may be stale)
            SandboxRecord = records.SandboxRecord
            with records.session(self.store) as db:
                query = select(SandboxRecord).where(
                    SandboxRecord.owner == self.owner, col(SandboxRecord.status).in_(LIVE)
                )
                live = db.exec(query).all()
            held = {record.id: held.get(record.id) or _info_of(record) for record in live}
        return sorted(held.values(), key=lambda s: s.created_at)

    def close(self) -> None:
        """Delete every sandbox this manager owns and stop its threads; idempotent.

        Every sandbox is tried even if one delete fails; the first failure is raised at the end.
        A manager closed without being started has nothing to undo. A fleet's sandboxes outlive
        the replica: it deletes only its warm pools, and leaves the fleet.
        """
        with self._start_lock:  # not while it starts: a start finishes first, then is undone
            if self._closed.is_set():
                return
            self._closed.set()
        self.pools.close()
        failures = []
        if self.fleet is not None and self._started:
            for sandbox_id in self.pools.give_up():  # held for this replica's hand-outs only
                try:
                    self.delete(sandbox_id)
                except Exception as exc:
                    failures.append(exc)
            with self._lock:
                self._sandboxes.clear()
            self._leave_fleet()
        for info in self.list() if self.fleet is None else []:
            try:
                self.delete(info.sandbox_id)
            except Exception as exc:  # keep deleting the others; raise after
                failures.append(exc)
        self._recorder.close()
        close_backend = getattr(self._backend, "close", None)
        if close_backend:
            close_backend()
        if failures:
            raise failures[0]

    def __enter__(self) -> SandboxManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reaping ----------------------------------------------------------------------

    def reap(self, now: float | None = None) -> builtins.list[str]:
        """Delete expired sandboxes and orphans whose owner process is gone; return their ids."""
        now = now or time.time()
        reaped = []
        for found in self.backend.list():
            expired = found.expires_at and found.expires_at < now
            if expired or not owner_alive(found.owner) or self._orphaned(found):
                self.backend.delete(check_sandbox_id(found.sandbox_id), found.owner)
                with self._lock:
                    self._sandboxes.pop(found.sandbox_id, None)
                reason = "expired (TTL)" if expired else f"orphaned (owner {found.owner} is gone)"
                self._mark_reaped(found.sandbox_id, reason)
                reaped.append(found.sandbox_id)
        sweep = getattr(self.backend, "sweep", None)
        if sweep is not None:
            try:
                sweep()
            except OrchardError as exc:  # e.g. a Role from before Leases: reaping by pid and TTL goes on
                log.warning("could not sweep lapsed owners' Leases: %s", exc)
        return reaped

    def _orphaned(self, found: BackendSandbox) -> bool:
        """Whether the backend knows the sandbox's owner (on any host) is gone; False when it cannot tell."""
        orphaned = getattr(self.backend, "orphaned", None)
        if orphaned is None:
            return False
        try:
            return bool(orphaned(found))
        except OrchardError as exc:
            log.warning("could not tell whether the owner of sandbox %s is alive: %s", found.sandbox_id, exc)
            return False

    def recover(self) -> int:
        """Close what dead owners left open in the store: their live sandboxes and running jobs.

        A process killed outright (SIGKILL, a crash, a lost machine) cannot say how its
        commands ended; they are marked failed with that reason, never left `running`.
        """
        closed = 0
        now = time.time()
        with records.session(self.store) as db:
            open_boxes = db.exec(select(records.SandboxRecord).where(col(records.SandboxRecord.status).in_(LIVE))).all()
            dead = {box.id for box in open_boxes if not owner_alive(box.owner)}
            for box in open_boxes:
                if box.id in dead:
                    box.status, box.deleted_at = "deleted", now
                    box.status_message = f"its owner {box.owner} stopped without deleting it (reaped)"
                    db.add(box)
                    closed += 1
            running = select(records.ExecRecord).where(col(records.ExecRecord.status).in_(("queued", "running")))
            for job in db.exec(running).all():
                owner_gone = job.sandbox_id in dead or job.sandbox_id not in {b.id for b in open_boxes}
                if owner_gone:
                    job.status, job.completed_at = "failed", now
                    job.error = "the process running this command stopped (killed or crashed); its outcome is unknown"
                    db.add(job)
                    closed += 1
        return closed

    def heartbeat(self, sandbox_id: str) -> None:
        """Record a client's heartbeat for a live sandbox of this owner (in the store: a fleet shares it)."""
        with records.session(self.store) as db:
            record = db.get(records.SandboxRecord, check_sandbox_id(sandbox_id))
            if record is not None and record.owner == self.owner and record.status in LIVE:
                record.heartbeat_at = time.time()
                db.add(record)

    def silent(self, since: float) -> builtins.list[str]:
        """Live sandboxes of this owner that had a heartbeat, but none after `since`."""
        SandboxRecord = records.SandboxRecord
        with records.session(self.store) as db:
            query = select(SandboxRecord.id).where(
                SandboxRecord.owner == self.owner,
                col(SandboxRecord.status).in_(LIVE),
                col(SandboxRecord.heartbeat_at).is_not(None),
                col(SandboxRecord.heartbeat_at) < since,
            )
            return builtins.list(db.exec(query).all())

    def beat(self) -> None:
        """This replica of the fleet is alive (its commands are not to be failed)."""
        assert self.fleet is not None
        now = time.time()
        with records.session(self.store) as db:
            replica = db.get(records.ReplicaRecord, self.process)
            if replica is None:
                replica = records.ReplicaRecord(id=self.process, fleet=self.fleet.name, started_at=now, beat_at=now)
            replica.beat_at = now
            db.add(replica)

    def _leave_fleet(self) -> None:
        """This replica stops: its commands still open end `failed` (nobody will finish them), and
        it leaves the replicas' table."""
        ExecRecord = records.ExecRecord
        with records.session(self.store) as db:
            mine = select(ExecRecord).where(
                ExecRecord.runner == self.process, col(ExecRecord.status).in_(("queued", "running"))
            )
            for job in db.exec(mine).all():
                job.status, job.completed_at = "failed", time.time()
                job.error = "the replica running this command stopped (shut down); its outcome is unknown"
                db.add(job)
            replica = db.get(records.ReplicaRecord, self.process)
            if replica is not None:
                db.delete(replica)

    def _beat_forever(self) -> None:
        assert self.fleet is not None
        while not self._closed.wait(self.fleet.beat_seconds):
            try:
                self.beat()
            except Exception:  # the store may be briefly away: the next beat tries again
                log.warning("could not beat in the store", exc_info=True)

    def fail_jobs_of_silent_replicas(self, silence: float) -> int:
        """Fail the running commands of replicas whose beat did not change for `silence` seconds
        (killed, or their host lost: their outcome is unknown); forget those replicas. Returns how
        many commands were failed.

        Silence is timed on this host's monotonic clock from when this replica last saw each
        replica's beat change, never by comparing another host's clock with this one's; and when
        this replica itself could not look for a while (the store was away), it starts over.
        """
        assert self.fleet is not None
        ReplicaRecord, ExecRecord = records.ReplicaRecord, records.ExecRecord
        now, seen = time.time(), time.monotonic()
        with records.session(self.store) as db:
            replicas = db.exec(select(ReplicaRecord).where(ReplicaRecord.fleet == self.fleet.name)).all()
            if seen - self._last_look > silence / 2:  # this replica was away itself: judge nobody yet
                self._beats_seen.clear()
            self._last_look = seen
            for replica in replicas:
                last = self._beats_seen.get(replica.id)
                if last is None or last[0] != replica.beat_at:
                    self._beats_seen[replica.id] = (replica.beat_at, seen)
            silent = [r.id for r in replicas if r.id != self.process and seen - self._beats_seen[r.id][1] > silence]
            for gone in set(self._beats_seen) - {r.id for r in replicas}:
                del self._beats_seen[gone]
            if not silent:
                return 0
            for replica in replicas:
                if replica.id in silent:
                    db.delete(replica)
            open_jobs = select(ExecRecord).where(
                col(ExecRecord.status).in_(("queued", "running")), col(ExecRecord.runner).in_(silent)
            )
            failed = 0
            for job in db.exec(open_jobs).all():
                job.status, job.completed_at = "failed", now
                job.error = "the replica running this command stopped (killed or lost); its outcome is unknown"
                db.add(job)
                failed += 1
        return failed

    def _reap_forever(self, interval: float) -> None:
        while not self._closed.wait(interval):
            try:
                self.reap()
            except Exception:  # the engine may be briefly unreachable; try again next round
                log.warning("reaping failed; retrying in %.0f s", interval, exc_info=True)

    # -- tracking ---------------------------------------------------------------------

    def record_exec(self, sandbox_id: str, command: str, result, started_at: float, job_id: str | None = None) -> None:
        """Queue one command for the store (written in batches off the hot path)."""
        self._recorder.put(job_id or secrets.token_hex(8), sandbox_id, command, result, started_at)

    def exec_record(self, job_id: str, sandbox_id: str, command: str, result, started_at: float) -> records.ExecRecord:
        """The store's record of a finished command run by this process (for a caller's own transaction)."""
        return _exec_record(job_id, sandbox_id, command, result, started_at, runner=self.process)

    def flush(self) -> None:
        """Wait until every recorded command is in the store."""
        self._recorder.flush()

    def record_started(self, job_id: str, sandbox_id: str, command: str, started_at: float) -> None:
        """Write a `running` row now (not batched): a crash before the command ends must not lose it."""
        with records.session(self.store) as db:
            db.merge(
                records.ExecRecord(
                    id=job_id,
                    sandbox_id=sandbox_id,
                    command=command,
                    status="running",
                    created_at=started_at,
                    started_at=started_at,
                    runner=self.process,
                )
            )

    def recorded_job(self, job_id: str) -> records.ExecRecord | None:
        """A job as the store has it (for jobs of an earlier run of the service)."""
        with records.session(self.store) as db:
            return db.get(records.ExecRecord, job_id)

    def _update(self, sandbox_id: str, **changes) -> SandboxInfo:
        with self._lock:
            current = self._sandboxes.get(sandbox_id)
            if current is None:
                raise NotFound(f"sandbox {sandbox_id} was deleted")
            info = replace(current, **changes)
            self._sandboxes[sandbox_id] = info
        if not self._save(info):  # ended meanwhile (another replica deleted it): forget this copy
            with self._lock:
                self._sandboxes.pop(sandbox_id, None)
            raise NotFound(f"sandbox {sandbox_id} was deleted")
        return info

    def _fail(self, sandbox_id: str, message: str) -> SandboxInfo:
        return self._raise_if_failed(self._discard(sandbox_id, message))

    def _discard(self, sandbox_id: str, message: str, *, remove: bool = True) -> SandboxInfo:
        """Remove whatever the backend made, and keep the sandbox only as a `failed` record."""
        if remove:
            self.backend.delete(sandbox_id, self.owner)
        with self._lock:
            info = self._sandboxes.pop(sandbox_id, None)
        if info is None:
            raise NotFound(f"sandbox {sandbox_id} was deleted")
        info = replace(info, status="failed", status_message=message)
        if not self._save(info):
            raise NotFound(f"sandbox {sandbox_id} was deleted")
        return info

    @staticmethod
    def _raise_if_failed(info: SandboxInfo) -> SandboxInfo:
        if info.status == "failed":
            raise SandboxError(info.status_message or f"sandbox {info.sandbox_id} failed")
        return info

    def _save(self, info: SandboxInfo, deleted_at: float | None = None) -> bool:
        """Record the sandbox; False (nothing written) when the store has this very sandbox (same
        creation time) as ended already: a stale copy (another replica deleted it, or a delete
        raced a look) never brings it back or relabels it, except a failed one that is deleted."""
        with records.session(self.store) as db:
            earlier = db.get(records.SandboxRecord, info.sandbox_id)
            same = earlier if earlier is not None and abs(earlier.created_at - info.created_at) < 1e-3 else None
            if same and same.status not in LIVE and not (same.status == "failed" and info.status == "deleted"):
                return False
            db.merge(
                records.SandboxRecord(
                    id=info.sandbox_id,
                    backend=self.backend.name,
                    image=info.spec.image,
                    network=info.spec.network,
                    cpu=info.spec.cpu,
                    memory_bytes=info.spec.memory_bytes,
                    owner=info.spec.owner,
                    run_id=info.spec.run_id,
                    status=info.status,
                    status_message=info.status_message,
                    created_at=info.created_at,
                    ready_at=info.ready_at,
                    deleted_at=deleted_at,
                    ttl=info.spec.ttl,
                    heartbeat_at=same.heartbeat_at if same else None,  # never an earlier sandbox's
                )
            )
        return True

    def _close_record(self, sandbox_id: str) -> None:
        with records.session(self.store) as db:
            record = db.get(records.SandboxRecord, sandbox_id)
            if record is not None and record.owner == self.owner and record.status in LIVE:
                record.status, record.deleted_at = "deleted", time.time()
                db.add(record)

    def _mark_reaped(self, sandbox_id: str, reason: str) -> None:
        with records.session(self.store) as db:
            record = db.get(records.SandboxRecord, sandbox_id)
            if record is not None:
                record.status, record.status_message = "deleted", f"reaped: {reason}"
                record.deleted_at = time.time()
                db.add(record)


def _info_of(record: records.SandboxRecord) -> SandboxInfo:
    """A sandbox as its store record has it (no endpoint: the record holds none)."""
    spec = SandboxSpec(
        image=record.image,
        network="open" if record.network == "open" else "dropped" if record.network == "dropped" else "blocked",
        cpu=record.cpu,
        memory_bytes=record.memory_bytes,
        ttl=record.ttl,
        owner=record.owner,
        run_id=record.run_id,
    )
    status: Status = record.status  # type: ignore[assignment]
    return SandboxInfo(record.id, spec, None, status, record.created_at, record.status_message, record.ready_at)


def agent_http(endpoint: AgentEndpoint, *, timeout: float | None = None) -> AgentChannel:
    """A pooled keep-alive channel straight to one agent (Unix socket or address)."""
    return AgentChannel(endpoint, timeout=timeout)


def async_agent_http(endpoint: AgentEndpoint, *, timeout: float | None = None) -> AsyncAgentChannel:
    """The async twin of `agent_http`."""
    return AsyncAgentChannel(endpoint, timeout=timeout)


def _answers(channel: AgentChannel, endpoint: AgentEndpoint) -> bool:
    if endpoint.uds and not os.path.exists(endpoint.uds):  # the agent renames it into place ready
        return False
    try:
        return channel.request(HEALTH).status_code == 200
    except AgentError:
        return False


HEALTH = Call("GET", HEALTH_ROUTE, lambda answer: answer)
INIT_OUTPUT = 64 * 1024
"""Bytes of each output stream of a spec's `init` that the agent keeps (and the host reads back)."""
INIT_TAIL = 2000
"""Characters of a failed init's output its sandbox's error keeps."""


class _ExecRecorder:
    """Writes exec records in batches from one thread, so commands never wait on the store."""

    def __init__(self, store: Store | None, runner: str | None = None):
        self.store = store or Store.open()
        self.runner = runner
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="orchard-exec-recorder")

    def start(self) -> None:
        self._thread.start()

    def put(self, job_id: str, sandbox_id: str, command: str, result, started_at: float) -> None:
        self._queue.put((job_id, sandbox_id, command, result, started_at))

    def flush(self, timeout: float = 30.0) -> None:
        """Block until everything queued so far is written (or failed to be)."""
        if not self._thread.is_alive():
            return
        written = threading.Event()
        self._queue.put(written)
        written.wait(timeout)

    def close(self) -> None:
        """Flush what is queued, then stop (nothing to do if it never started)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            rows = [item for item in batch if isinstance(item, tuple)]
            try:
                if rows:
                    with records.session(self.store) as db:
                        for row in rows:  # merge: a job may have been recorded as running already
                            db.merge(_exec_record(*row, runner=self.runner))
            except Exception:  # a store outage must not stop recording for good
                log.exception("could not record %d command(s) in the store", len(rows))
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
            if None in batch:
                return

    def _next_batch(self) -> list:
        """Everything queued within BATCH_SECONDS of the first item (a flush or stop cuts it short).

        One transaction per batch, not per command: a commit per command would compete with
        the commands themselves for the CPU.
        """
        batch = [self._queue.get()]
        deadline = time.monotonic() + BATCH_SECONDS
        while not isinstance(batch[-1], threading.Event) and batch[-1] is not None and len(batch) < 1000:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(self._queue.get(timeout=remaining))
            except queue.Empty:
                break
        return batch


BATCH_SECONDS = 0.2
"""How long the exec recorder gathers commands before one write."""


def _exec_record(
    job_id: str, sandbox_id: str, command: str, result, started_at: float, *, runner: str | None = None
) -> records.ExecRecord:
    return records.ExecRecord(
        runner=runner,
        id=job_id,
        sandbox_id=sandbox_id,
        command=command,
        status="succeeded" if result.exit_code == 0 else "failed",
        exit_code=result.exit_code,
        error=result.error,
        stdout_bytes=result.stdout_bytes,
        stderr_bytes=result.stderr_bytes,
        created_at=started_at,
        started_at=started_at,
        completed_at=started_at + result.duration,
        duration=result.duration,
    )

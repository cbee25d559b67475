"""`orchard up`: the Orchard Env REST API over a sandbox manager.

Routes, fields and status codes follow `docs/api.md` (the API of the published Orchard
Env service) so its clients work unchanged: `null` (and a timeout of 0) means a field's default;
cpu and memory are Kubernetes quantities, echoed as sent (`allocated` says what the sandbox got
on this host); a sandbox's jobs and patches run one at a time in submission order; 422s carry
FastAPI's `detail` list; every answer has an `X-Request-ID` (the client's, when it sent one).
Extensions: `GET /sandboxes` (list), `GET/PUT /sandboxes/{id}/archive` (folders as tar), `ttl`,
`env`, `run_id`, `network` (`dropped`), `init` and `init_timeout` (a command run once before the
sandbox is ready: `SandboxSpec.init`) on create, and on jobs `truncated`, `timed_out`,
`stdout_bytes`, `stderr_bytes`, `rejected` (the agent refused the request itself, e.g. a missing
cwd) and `output_dropped`; `session` on exec (a persistent shell), `concurrent` (run beside the
sandbox's other jobs) and `DELETE /sandboxes/{id}/shell`; `POST/GET /pools` (warm pools; `drain` shrinks one now); a
422's one-line `message`. Beyond `max_starting` sandboxes starting or `max_running` commands
running, requests get 503 with Retry-After, before anything is done; so does a client past its
fair share of `max_running` (`Service._take_slot`). A duplicate `sandbox_id` is 409. An image
that cannot be found gives 200 with `status: "failed"` and the reason, at once. An exec on a
pending sandbox waits for it (up to `timeout_seconds`); on a failed one it is 404.

The service holds one keep-alive connection to each sandbox's agent (a Unix socket locally) and
runs commands as jobs on the event loop; Docker is called only to create and delete. Every route
but `GET /` and `GET /health` needs the `X-API-Key` header (401 missing, 403 wrong), checked
before a byte of the body is read; a request's head is capped before the key is read (431 past
`MAX_REQUEST_HEAD`), bodies as they arrive, chunked or not (413).

Clients hold the key; sandboxes are hostile, so what the service reads from one is bounded: a
file (`GET /files`, 64 MiB), a tar (`GET /archive`, 1 GiB, spooled to a temporary file and
streamed), an exec answer (the agent's output cap); past a bound it answers 413. The output of
finished jobs kept in memory is bounded in all (`KEPT_OUTPUT_BYTES`): the oldest is dropped first,
the job's outcome kept and `output_dropped` set.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import functools
import hmac
import json
import logging
import os
import re
import secrets
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, BinaryIO, ClassVar, Literal

from fastapi import FastAPI, HTTPException, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, StrictStr, ValidationError, field_validator, model_validator
from sqlalchemy import delete as sqlalchemy_delete
from sqlmodel import col
from starlette.concurrency import run_in_threadpool

from orchard import __version__
from orchard import store as records
from orchard.config import private_file, private_folder, settings
from orchard.env.agent.protocol import HTTP_DEFAULT_MAX_BYTES, HTTP_MAX_BYTES, HTTP_MAX_TIMEOUT
from orchard.env.backends import backend_config
from orchard.env.backends.base import (
    DEFAULT_TTL,
    MAX_INIT,
    MAX_INIT_TIMEOUT,
    SANDBOX_ID,
    SANDBOX_ID_MAX_LENGTH,
    SandboxSpec,
    is_sandbox_id,
    make_spec,
    parse_cpu,
    parse_memory,
)
from orchard.env.calls import (
    ARCHIVE_LIMIT,
    READ_LIMIT,
    AgentCalls,
    ExecResult,
    asend,
    command_text,
    http_answer_json,
)
from orchard.env.discovery import remove_state, write_state
from orchard.env.manager import Fleet, SandboxInfo, SandboxManager, async_agent_http, new_sandbox_id
from orchard.env.pty import open_agent_relay
from orchard.env.transport import AsyncAgentChannel
from orchard.errors import (
    AgentError,
    AuthError,
    ConfigError,
    Conflict,
    EngineUnavailable,
    InvalidRequest,
    NotFound,
    OrchardError,
    Overloaded,
    SandboxError,
    TooLarge,
)

MAX_UPLOAD_BYTES = 256 * 2**20
"""Largest file or archive one request may upload (413 beyond)."""
JOB_KEEP_SECONDS = 3600.0
"""Finished jobs stay readable at least this long."""
KEPT_OUTPUT_BYTES = 256 * 2**20
"""Memory the output of all finished jobs may take; past it the oldest jobs' output is dropped."""
MAX_REQUEST_HEAD = 64 * 1024
"""Largest request head (request line and headers) the service takes, before anything else, the
key included: 431 and the connection closed beyond. What one connection makes the service hold
before that is this plus one read (256 KiB at most)."""


def capped_http_protocol() -> type | str:
    """uvicorn's httptools protocol with the request head capped at `MAX_REQUEST_HEAD` (httptools
    holds a header's value whole until it ends, so a client without a key could make the service
    hold any amount); `h11` (capped by uvicorn's own option) where httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "h11"

    class CappedHead(HttpToolsProtocol):
        head_bytes = 0
        head_done = False

        def on_message_begin(self) -> None:
            self.head_bytes, self.head_done = 0, False
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self.head_done = True
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.head_done or self.transport.is_closing():
                return
            self.head_bytes += len(data)
            if self.head_bytes > MAX_REQUEST_HEAD:
                message = f"the request's head is over {MAX_REQUEST_HEAD // 1024} KiB".encode()
                self.transport.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(message), message)
                )
                self.transport.close()

    return CappedHead


UVICORN_OPTIONS: dict[str, Any] = {
    "timeout_keep_alive": 150,
    "access_log": False,
    # A client's address is the peer's: uvicorn would otherwise take X-Forwarded-For from any
    # loopback client, so one client could name itself many and take every command slot.
    "proxy_headers": False,
    "http": capped_http_protocol(),
    "h11_max_incomplete_event_size": MAX_REQUEST_HEAD,
}
"""How `orchard up` runs uvicorn (tests run their services with the same)."""
HEARTBEAT_SILENCE_SECONDS = 180.0
"""A sandbox that heartbeated once and then fell silent this long is reaped."""
REPLICA_SILENCE_SECONDS = 30.0
"""A replica of a fleet that did not beat in the store this long is taken as gone."""
STORE_POLL_SECONDS = 0.25
"""How often a replica looks in the store while it waits for a job another replica runs."""

log = logging.getLogger("orchard.env.service")


# -- request bodies (extra fields are ignored, as clients of the published API may send more) --


class Body(BaseModel):
    """A request body where `null` means the field's default, as in the published service (its
    SDK sends `"timeout_seconds": null` for every exec without a timeout); a timeout of 0 too."""

    zero_is_default: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None and not (k in cls.zero_is_default and v == 0)}


class CreateSandbox(Body):
    zero_is_default = ("timeout",)

    image: StrictStr = Field(min_length=1)
    block_network: bool = True
    network: Literal["blocked", "dropped", "open"] | None = Field(
        default=None,
        description="Extension: overrides block_network; 'dropped' is blocked with connections out timing out.",
    )
    sandbox_id: StrictStr | None = Field(
        default=None, max_length=SANDBOX_ID_MAX_LENGTH, pattern=f"^{SANDBOX_ID.pattern}$"
    )
    cpu: StrictStr = Field(default="4", description="A Kubernetes CPU quantity: '2', '0.5', '2000m'.")
    memory: StrictStr = Field(default="16Gi", description="A Kubernetes memory quantity: '512Mi', '16Gi', '1G'.")
    timeout: int = Field(default=3600, gt=0, description="Seconds; a sandbox not ready within timeout + 600 is reaped.")
    disk: StrictStr | None = Field(default=None, description="Extension: cap on filesystem writes, e.g. 10Gi.")
    tmpfs: dict[StrictStr, StrictStr] | None = Field(default=None, description="Extension: in-memory folders.")
    ttl: int = Field(default=int(DEFAULT_TTL), gt=0, description="Extension: seconds until the sandbox is reaped.")
    env: dict[StrictStr, StrictStr] | None = Field(default=None, description="Extension: environment of commands.")
    run_id: StrictStr | None = Field(default=None, description="Extension: the run it belongs to.")
    init: StrictStr | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_INIT,
        description="Extension: a shell command run once before the sandbox is ready; if it fails, so does the sandbox.",
    )
    init_timeout: float = Field(
        default=60.0, gt=0, le=MAX_INIT_TIMEOUT, allow_inf_nan=False, description="Extension: seconds `init` may run."
    )
    tools: bool = Field(
        default=False, description="Extension: mount the agent CLIs' bundle read-only at /.orchard-tools."
    )

    @field_validator("cpu")
    @classmethod
    def _cores(cls, cpu: str) -> str:
        parse_cpu(cpu)  # InvalidRequest is a ValueError: pydantic reports it with the field
        return cpu

    @field_validator("memory")
    @classmethod
    def _size(cls, memory: str) -> str:
        parse_memory(memory)
        return memory


class PoolBody(CreateSandbox):
    size: int = Field(ge=0, le=256, description="How many sandboxes of this kind to keep started.")
    drain: bool = Field(
        default=False,
        description="Extension: delete the ready sandboxes beyond `size` now, and those starting once up.",
    )


class ExecBody(Body):
    zero_is_default = ("timeout_seconds",)

    command: StrictStr | list[StrictStr] = Field(min_length=1)
    timeout_seconds: float = Field(default=300, gt=0, allow_inf_nan=False)
    cwd: StrictStr | None = None
    env: dict[StrictStr, StrictStr] | None = None
    login_shell: bool = False
    wait: bool = False
    session: StrictStr | None = Field(
        default=None, max_length=64, description="Extension: run in this persistent shell session."
    )
    concurrent: bool = Field(
        default=False, description="Extension: run beside the sandbox's other jobs, not after them in order."
    )


class PatchBody(Body):
    zero_is_default = ("timeout_seconds",)

    patch: StrictStr
    timeout_seconds: float = Field(default=30, gt=0, allow_inf_nan=False)


class HttpBody(Body):
    """Extension: one HTTP request to a service on the sandbox's loopback (the agent's `POST /http`)."""

    zero_is_default = ("timeout",)

    port: int = Field(ge=1, le=65535, description="The service's port on the sandbox's 127.0.0.1.")
    method: StrictStr = "POST"
    path: StrictStr = Field(description="The request target, starting with / (a query string included).")
    headers: dict[StrictStr, StrictStr] | None = None
    body: StrictStr | None = Field(default=None, description="base64")
    timeout: float = Field(default=30, gt=0, le=HTTP_MAX_TIMEOUT, allow_inf_nan=False)
    max_bytes: int = Field(default=HTTP_DEFAULT_MAX_BYTES, ge=0, le=HTTP_MAX_BYTES)


class FileBody(Body):
    path: StrictStr = Field(min_length=1)
    content: StrictStr
    mode: int | None = Field(default=None, ge=0, le=0o7777)


# -- state ----------------------------------------------------------------------------------


@dataclass
class Job:
    """One command run as a job; its object is the API's job object plus a few extensions."""

    job_id: str
    sandbox_id: str
    command: str
    status: str = "queued"
    result: ExecResult | None = None
    error: str | None = None
    rejected: bool = False
    """The agent refused the request itself (bad cwd, ...); the SDK raises InvalidRequest."""
    output_dropped: bool = False
    """Its output was dropped to keep finished jobs within the service's memory budget."""
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    completed_at: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    answer: dict[str, Any] | None = None
    """The whole answer, as another replica of the fleet stored it."""

    def public(self) -> dict[str, Any]:
        if self.answer is not None:
            return self.answer
        result = self.result
        return {
            "job_id": self.job_id,
            "sandbox_id": self.sandbox_id,
            "command": self.command,
            "status": self.status,
            "stdout": result.stdout if result else "",
            "stderr": result.stderr if result else "",
            "exit_code": result.exit_code if result else None,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "error": self.error,
            # extensions
            "truncated": result.truncated if result else False,
            "timed_out": result.timed_out if result else False,
            "stdout_bytes": result.stdout_bytes if result else 0,
            "stderr_bytes": result.stderr_bytes if result else 0,
            "rejected": self.rejected,
            "output_dropped": self.output_dropped,
        }

    def drop_output(self) -> None:
        """Forget stdout and stderr, keeping the outcome; `error` says why they are empty."""
        if self.result is not None:
            self.result = dataclasses.replace(self.result, stdout="", stderr="")
        self.output_dropped = True
        dropped = "output dropped: the service keeps a bounded amount of finished jobs' output; read jobs sooner"
        self.error = f"{self.error}; {dropped}" if self.error else dropped


class Service:
    """The service's state: the manager, agent connections, readiness, heartbeats and jobs."""

    def __init__(
        self,
        manager: SandboxManager,
        api_key: str | None,
        *,
        max_upload_bytes: int = MAX_UPLOAD_BYTES,
        max_file_read_bytes: int = READ_LIMIT,
        max_archive_read_bytes: int = ARCHIVE_LIMIT,
        heartbeat_silence: float = HEARTBEAT_SILENCE_SECONDS,
        replica_silence: float = REPLICA_SILENCE_SECONDS,
        housekeep_interval: float = 5.0,
        max_starting: int = 64,
        max_running: int = 1024,
        kept_output_bytes: int = KEPT_OUTPUT_BYTES,
    ):
        self.manager = manager
        self.api_key = api_key
        self.max_upload_bytes = max_upload_bytes
        self.max_file_read_bytes, self.max_archive_read_bytes = max_file_read_bytes, max_archive_read_bytes
        """The most the service reads of one file (answered base64 in JSON) or one tar (streamed
        through a temporary file) from a sandbox; 413 beyond."""
        self.heartbeat_silence = heartbeat_silence
        """A sandbox that had a heartbeat and then none for this long is deleted (the store keeps
        the heartbeats, so in a fleet any replica may receive them)."""
        self.replica_silence = replica_silence
        """A fleet's replica that did not beat for this long is taken as gone: its commands fail."""
        self.housekeep_interval = housekeep_interval
        self.max_starting, self.max_running = max_starting, max_running
        """Beyond these many sandboxes starting or commands running, requests get 503 + Retry-After."""
        self._starting = 0
        self._running = 0
        self._held: dict[str, int] = {}
        """Running commands per client (the peer's address), for fair shares of `max_running`."""
        self.agents: dict[str, AsyncAgentChannel] = {}
        self.ready: dict[str, asyncio.Event] = {}
        self.jobs: dict[str, Job] = {}
        self.asked: dict[str, tuple[str, str]] = {}
        """The cpu and memory each sandbox was created with, as sent: answers echo them."""
        self.queues: dict[str, asyncio.Lock] = {}
        """Per sandbox, the FIFO its jobs (and patches) run through one at a time, in submission order."""
        self.kept_output_bytes = kept_output_bytes
        self._kept: dict[str, int] = {}
        """Finished jobs that still hold output, oldest first, and the bytes each holds."""
        self._kept_total = 0
        self.on_close: list[Callable[[], None]] = []
        """Run after every sandbox is deleted at shutdown (uvicorn re-raises SIGTERM right after)."""
        self._tasks: set[asyncio.Task] = set()
        # Waiting for readiness mostly sleeps; a pool of its own keeps it from starving the
        # shared worker threads that the synchronous routes use.
        self._waiters = ThreadPoolExecutor(max_workers=256, thread_name_prefix="orchard-ready")

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a background task, keeping a reference until it ends."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # sandboxes

    async def create(self, body: CreateSandbox) -> dict[str, Any]:
        spec = spec_of(body)
        if body.sandbox_id is None:
            pooled = self.manager.pools.acquire(spec)  # a local hand-over: no thread needed
            if pooled is not None:
                pooled = self.manager.claim(pooled, spec.run_id)
                assert pooled.endpoint is not None
                self.agents[pooled.sandbox_id] = async_agent_http(pooled.endpoint)
                self.asked[pooled.sandbox_id] = (body.cpu, body.memory)
                return {**self.describe(pooled), "timeout": body.timeout}
        if self._starting >= self.max_starting:  # refuse now rather than pile up: nothing was done
            raise Overloaded(f"{self._starting} sandboxes are starting already; retry shortly")
        sandbox_id = body.sandbox_id or new_sandbox_id()
        self.asked[sandbox_id] = (body.cpu, body.memory)
        self._starting += 1
        try:
            info = await run_in_threadpool(self.manager.launch, spec, sandbox_id=sandbox_id)
        except (NotFound, SandboxError):  # failed at once; the store keeps it `failed` with the reason
            self._starting -= 1
            failed = self.manager.recorded(sandbox_id)
            if failed is None:
                raise
            return {**self.describe(failed), "timeout": body.timeout}
        except BaseException:
            self._starting -= 1
            raise
        self.ready[sandbox_id] = asyncio.Event()
        self.spawn(self._become_ready(sandbox_id, body.timeout + 600))
        return {**self.describe(info), "timeout": body.timeout}

    async def _become_ready(self, sandbox_id: str, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            info = await loop.run_in_executor(
                self._waiters, functools.partial(self.manager.wait_ready, sandbox_id, timeout=timeout)
            )
        except OrchardError:  # failed or deleted meanwhile: the store says which
            pass
        else:
            event = self.ready.get(sandbox_id)
            if event is not None and info.endpoint is not None and sandbox_id not in self.agents:  # still wanted
                self.agents[sandbox_id] = async_agent_http(info.endpoint)
        finally:
            self._starting -= 1
        event = self.ready.get(sandbox_id)
        if event is not None:
            event.set()

    async def info(self, sandbox_id: str) -> dict[str, Any]:
        """A live sandbox (its container checked), or a failed one from the store; 404 otherwise."""
        if not is_sandbox_id(sandbox_id):
            raise NotFound(f"no sandbox {sandbox_id!r}")
        info: SandboxInfo | None
        try:
            info = await run_in_threadpool(self.manager.check_alive, sandbox_id)
        except NotFound:
            info = self.manager.recorded(sandbox_id)
        else:
            self._serve(info)
        if info is None or info.status not in ("pending", "ready", "failed"):
            raise NotFound(f"no sandbox {sandbox_id!r}")
        if info.status == "failed":
            await self._drop_agent(sandbox_id)
        return self.describe(info)

    def _serve(self, info: SandboxInfo) -> None:
        """In a fleet, serve a live sandbox another replica started, or saw ready before this one:
        connect to its agent, or wait for it to become ready as its creator would."""
        sandbox_id = info.sandbox_id
        if self.manager.fleet is None or sandbox_id in self.agents or not info.endpoint:
            return
        if info.ready:  # also one this replica is still starting: another saw it ready first, and a client
            self.agents[sandbox_id] = async_agent_http(info.endpoint)  # told so may come here next
        elif info.status == "pending" and sandbox_id not in self.ready:
            self.ready[sandbox_id] = asyncio.Event()
            self._starting += 1
            self.spawn(self._become_ready(sandbox_id, max(60.0, info.spec.ttl)))

    def describe(self, info: SandboxInfo) -> dict[str, Any]:
        """The API's sandbox object; `cpu` and `memory` as asked, `allocated` what it got here."""
        spec = info.spec
        cpu, memory = self.asked.get(info.sandbox_id) or (  # one this service did not create: what it has
            "" if spec.cpu is None else f"{spec.cpu:g}",
            "" if spec.memory_bytes is None else format_memory(spec.memory_bytes),
        )
        return {
            "sandbox_id": info.sandbox_id,
            "namespace": self.manager.backend.name,
            "image": spec.image,
            "pod_name": self.manager.backend.pod_name(info.sandbox_id),
            "block_network": spec.network != "open",
            "cpu": cpu,
            "memory": memory,
            "created_at": info.created_at,
            "ready": info.ready,
            "status": info.status,
            "status_message": info.status_message or "",
            # extensions
            "network": spec.network,
            "allocated": {"cpu": spec.cpu, "memory_bytes": spec.memory_bytes},
        }

    async def wait(self, sandbox_id: str, timeout: float) -> dict[str, Any]:
        event = self.ready.get(sandbox_id)
        if event is None:
            found = await self.info(sandbox_id)  # a fleet's sandbox still starting is adopted: now it has one
            event = self.ready.get(sandbox_id)
            if event is None:
                return found
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        return await self.info(sandbox_id)

    async def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox; an id that never was one (or is no valid id) is already deleted."""
        if not is_sandbox_id(sandbox_id):
            return
        event = self.ready.pop(sandbox_id, None)
        self.asked.pop(sandbox_id, None)
        self.queues.pop(sandbox_id, None)
        await self._drop_agent(sandbox_id)
        await run_in_threadpool(self.manager.delete, sandbox_id)
        if event is not None:
            event.set()

    async def _drop_agent(self, sandbox_id: str) -> None:
        agent = self.agents.pop(sandbox_id, None)
        if agent is not None:
            await agent.aclose()

    async def agent(self, sandbox_id: str, wait: float = 0.0) -> AsyncAgentChannel:
        """The connection to a sandbox's agent, waiting up to `wait` s for a pending sandbox; 404
        (as published) for one that is unknown, failed or still not ready."""
        agent = self.agents.get(sandbox_id)
        if agent is None:
            found = await self.wait(sandbox_id, wait)  # 404 when unknown
            agent = self.agents.get(sandbox_id)
            if agent is None:
                why = f": {found['status_message']}" if found["status_message"] else ""
                raise NotFound(f"sandbox {sandbox_id} is {found['status']}, its agent not ready{why}")
        return agent

    def queue(self, sandbox_id: str) -> asyncio.Lock:
        """The FIFO of a sandbox's jobs (an asyncio lock hands itself over in the order asked)."""
        return self.queues.setdefault(sandbox_id, asyncio.Lock())

    # jobs

    async def submit(self, sandbox_id: str, body: ExecBody, client: str) -> Job:
        """Start a command as a job for `client` (the peer's address), within its share of slots."""
        self._take_slot(client)  # before any await, so a burst cannot slip past the limit
        try:
            agent = await self.agent(sandbox_id, wait=body.timeout_seconds)
            command = command_text(body.command)
            job = Job(job_id=secrets.token_hex(8), sandbox_id=sandbox_id, command=command)
            if not body.wait:  # the caller only gets a job id: it must survive a crash of the service
                await run_in_threadpool(self.manager.record_started, job.job_id, sandbox_id, command, job.created_at)
        except BaseException:
            self._free_slot(client)
            raise
        self.jobs[job.job_id] = job
        queue = contextlib.nullcontext() if body.concurrent else self.queue(sandbox_id)
        self.spawn(self._run(job, agent, body, client, queue))
        return job

    def _take_slot(self, client: str) -> None:
        """Count a running command of `client`, or raise Overloaded.

        Beyond `max_running` in all, every command is refused. Below it, a client holds at most
        its share: the slots but a reserve (an eighth), split evenly between the clients running
        some. A client that floods never takes the reserve, so one that comes after it runs at once;
        and it gives way as the others' commands take its share. A client is the peer's address:
        clients share the service's one key, and a connection is no unit (every waiting exec holds
        one of its own).
        """
        if self._running >= self.max_running:
            raise Overloaded(f"{self._running} commands are running already; retry shortly")
        held = self._held.get(client, 0)
        clients = len(self._held) + (held == 0)
        share = max(1, (self.max_running - max(1, self.max_running // 8)) // clients)
        if held >= share:
            raise Overloaded(
                f"this client ({client or 'local'}) runs {held} commands, its fair share of the "
                f"{self.max_running} command slots while {clients - 1} other client(s) run some; retry shortly"
            )
        self._running += 1
        self._held[client] = held + 1

    def _free_slot(self, client: str) -> None:
        self._running -= 1
        held = self._held.pop(client) - 1
        if held:
            self._held[client] = held

    async def _run(
        self,
        job: Job,
        agent: AsyncAgentChannel,
        body: ExecBody,
        client: str,
        queue: contextlib.AbstractAsyncContextManager,
    ) -> None:
        """Run the job once its turn in the sandbox's FIFO comes; its timeout counts from then."""
        try:
            call = AgentCalls().exec(
                body.command,
                cwd=body.cwd,
                env=body.env,
                timeout=body.timeout_seconds,
                login_shell=body.login_shell,
                session=body.session,
            )
            async with queue:
                job.status, job.started_at = "running", time.time()
                answer = await asend(agent, call)
            job.result = result = dataclasses.replace(answer, raw_stdout=b"", raw_stderr=b"")  # text is enough
        except OrchardError as exc:
            job.error = await self._why_lost(job.sandbox_id, str(exc)) if type(exc) is AgentError else str(exc)
            job.rejected = isinstance(exc, InvalidRequest) and not isinstance(exc, TooLarge)  # the agent's, not ours
            result = ExecResult(exit_code=None, stdout="", stderr="", error=job.error)
        except Exception as exc:  # a bug or a garbled answer: the job still ends, with the reason
            log.exception("job %s failed", job.job_id)
            job.error = f"internal error ({type(exc).__name__}): {exc}"
            result = ExecResult(exit_code=None, stdout="", stderr="", error=job.error)
        else:
            job.error = f"command timed out after {body.timeout_seconds:g} s" if result.timed_out else result.error
        finally:
            self._free_slot(client)
        job.status = "succeeded" if result.exit_code == 0 else "failed"
        job.completed_at = time.time()
        outcome = dataclasses.replace(result, stdout="", stderr="")  # the store keeps no output
        started = job.started_at or job.created_at
        if self.manager.fleet is not None and not body.wait:  # another replica may be asked for it
            try:
                await run_in_threadpool(self._store_answer, job, outcome, started)
            except Exception:  # the store is away: this replica answers for it; the recorder retries the record
                log.exception("could not store the answer of job %s", job.job_id)
                self.manager.record_exec(job.sandbox_id, job.command, outcome, started, job_id=job.job_id)
        else:
            self.manager.record_exec(job.sandbox_id, job.command, outcome, started, job_id=job.job_id)
        self._keep_output(job)
        job.done.set()

    def _store_answer(self, job: Job, outcome: ExecResult, started: float) -> None:
        """The job's record and its whole answer, in one transaction (see `_job_from_store`)."""
        with records.session(self.manager.store) as db:
            db.merge(self.manager.exec_record(job.job_id, job.sandbox_id, job.command, outcome, started))
            answer = json.dumps(job.public(), ensure_ascii=False)
            completed = job.completed_at or time.time()
            db.merge(records.JobAnswerRecord(job_id=job.job_id, answer=answer, completed_at=completed))

    async def _why_lost(self, sandbox_id: str, error: str) -> str:
        """`error` (no answer from the agent), with the reason when the sandbox itself died: it is
        then failed and removed at once, not when someone next looks at it."""
        try:
            info = await run_in_threadpool(self.manager.check_alive, sandbox_id)
        except OrchardError:  # deleted meanwhile, or the backend is away: the error as it was
            return error
        if info.status != "failed":
            return error
        await self._drop_agent(sandbox_id)
        return f"{error}; {info.status_message}"

    def _keep_output(self, job: Job) -> None:
        """Count a finished job's output, dropping the oldest jobs' output past the budget."""
        if job.result is None:
            return
        size = sys.getsizeof(job.result.stdout) + sys.getsizeof(job.result.stderr)
        self._kept[job.job_id] = size
        self._kept_total += size
        while self._kept_total > self.kept_output_bytes:
            oldest = next(iter(self._kept))
            self._kept_total -= self._kept.pop(oldest)
            dropped = self.jobs.get(oldest)
            if dropped is not None:
                dropped.drop_output()

    async def wait_job(self, job_id: str, timeout: float) -> Job:
        job = self.jobs.get(job_id)
        if job is not None:
            if not job.done.is_set() and timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(job.done.wait(), timeout)
            return job
        # Another process runs or ran it: another replica of the fleet, or an earlier run of this service.
        deadline = time.monotonic() + timeout
        while True:
            job = await run_in_threadpool(self._job_from_store, job_id)
            if job is None:
                raise NotFound(f"no job {job_id!r} (finished jobs are kept {JOB_KEEP_SECONDS:.0f} s)")
            if job.done.is_set() or time.monotonic() >= deadline:
                return job
            await asyncio.sleep(min(STORE_POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    def _job_from_store(self, job_id: str) -> Job | None:
        """A job another process runs or ran, as the store has it: its whole answer when the replica
        that ran it stored one (a fleet's jobs started without waiting), else its outcome (no output).

        The record is read first: an answer is stored in the transaction that ends its record, so
        a record read as finished has its answer readable by then."""
        record = self.manager.recorded_job(job_id)
        if record is None:
            return None
        if record.status not in ("queued", "running"):
            with records.session(self.manager.store) as db:
                stored = db.get(records.JobAnswerRecord, job_id)
                box = db.get(records.SandboxRecord, record.sandbox_id)
            if stored is not None and box is not None and box.owner == self.manager.owner:  # this fleet's only
                answer = json.loads(stored.answer)
                job = Job(job_id=job_id, sandbox_id=record.sandbox_id, command=record.command, answer=answer)
                job.done.set()
                return job
        job = Job(job_id=record.id, sandbox_id=record.sandbox_id, command=record.command, status=record.status)
        job.error, job.created_at = record.error, record.created_at
        job.started_at, job.completed_at = record.started_at, record.completed_at
        if record.exit_code is not None:
            job.result = ExecResult(exit_code=record.exit_code, stdout="", stderr="")
        if record.status not in ("queued", "running"):
            job.done.set()
        return job

    # housekeeping

    async def housekeep(self) -> None:
        """Forget old jobs; reap sandboxes whose heartbeats stopped. Never stops on an error."""
        while True:
            await asyncio.sleep(self.housekeep_interval)
            try:
                await self._housekeep_once(time.time())
            except Exception:  # the store or the engine may be briefly unreachable: next round
                log.exception("housekeeping failed; retrying in %.1f s", self.housekeep_interval)

    async def _housekeep_once(self, now: float) -> None:
        for job_id, job in list(self.jobs.items()):
            if job.completed_at and now - job.completed_at > JOB_KEEP_SECONDS:
                self.jobs.pop(job_id, None)
                self._kept_total -= self._kept.pop(job_id, 0)
        for sandbox_id in list(self.agents):  # reaped at their TTL by the manager meanwhile
            if not self.manager.knows(sandbox_id):
                self.ready.pop(sandbox_id, None)
                await self._drop_agent(sandbox_id)
        if self.manager.fleet is not None:
            await run_in_threadpool(self._fleet_housekeeping, now)
        for sandbox_id in await run_in_threadpool(self.manager.silent, now - self.heartbeat_silence):
            try:
                await self.delete(sandbox_id)
            except Exception:  # try again next round
                log.exception("could not reap silent sandbox %s", sandbox_id)

    def _fleet_housekeeping(self, now: float) -> None:
        """Fail the commands of replicas gone silent; forget old answers (the manager beats for this one)."""
        self.manager.fail_jobs_of_silent_replicas(self.replica_silence)
        Answer = records.JobAnswerRecord
        with records.session(self.manager.store) as db:
            db.execute(sqlalchemy_delete(Answer).where(col(Answer.completed_at) < now - JOB_KEEP_SECONDS))

    async def close(self) -> None:
        """Close agent connections, delete every sandbox, run the close hooks."""
        await asyncio.gather(*(a.aclose() for a in self.agents.values()), return_exceptions=True)
        try:
            await run_in_threadpool(self.manager.close)
        finally:
            self._waiters.shutdown(wait=False, cancel_futures=True)
            for hook in self.on_close:
                hook()


def spec_of(body: CreateSandbox) -> SandboxSpec:
    """The spec a create body asks for; requests above what this host has are clamped."""
    spec = make_spec(
        body.image,
        network=body.network or ("blocked" if body.block_network else "open"),
        disk=body.disk,
        tmpfs=dict(body.tmpfs or {}),
        ttl=float(body.ttl),
        env=dict(body.env or {}),
        run_id=body.run_id,
        init=body.init,
        init_timeout=body.init_timeout,
        tools=body.tools,
    )
    cpu = min(parse_cpu(body.cpu), float(os.cpu_count() or 1))
    return dataclasses.replace(spec, cpu=cpu, memory_bytes=min(parse_memory(body.memory) or 0, host_memory()))


def host_memory() -> int:
    """Total memory of this host in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def format_memory(size: int) -> str:
    """`16Gi`, `512Mi` or a byte count: the Kubernetes spelling the API uses."""
    for unit, scale in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


# -- the app ----------------------------------------------------------------------------


def create_app(service: Service) -> FastAPI:
    """The FastAPI app serving the Orchard Env API over `service`."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        await run_in_threadpool(service.manager.start)  # a no-op for a manager started already
        service.spawn(service.housekeep())
        try:
            yield
        finally:
            await service.close()

    # No /docs, /redoc or /openapi.json: every route but / and /health needs the key.
    app = FastAPI(
        title="Orchard Env", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    _add_error_handlers(app)

    app.add_middleware(GuardRequests, service=service)

    @app.get("/")
    def root() -> dict:
        return {"service": "orchard-env", "version": __version__, "status": "running"}

    @app.get("/health")
    def health() -> dict:
        return {"status": "healthy"}

    @app.get("/resources")
    def resources() -> dict:
        """The published shape: this host is the one node; a sandbox's requests are what it got."""
        live = service.manager.list()
        total = {"cpu": float(os.cpu_count() or 1), "memory_bytes": host_memory()}
        requested = {
            "cpu": float(sum(s.spec.cpu or 0 for s in live)),
            "memory_bytes": sum(s.spec.memory_bytes or 0 for s in live),
        }
        namespace = service.manager.backend.name
        return {
            "status": "ok",
            "nodes": [{"name": socket.gethostname(), "capacity": total, "allocatable": total}],
            "total_capacity": total,
            "total_allocatable": total,
            "total_requested": requested,
            "available": {key: max(total[key] - requested[key], 0) for key in total},
            "sandbox_pods": [
                {
                    "name": service.manager.backend.pod_name(s.sandbox_id),
                    "namespace": namespace,
                    "phase": "Running" if s.ready else "Pending",
                    "cpu_request": float(s.spec.cpu or 0),
                    "memory_request_bytes": s.spec.memory_bytes or 0,
                    "sandbox_id": s.sandbox_id,  # extension
                }
                for s in live
            ],
        }

    @app.post("/sandboxes")
    async def create(body: CreateSandbox) -> dict:
        return await service.create(body)

    @app.post("/pools")
    async def warm(body: PoolBody) -> dict:
        """Extension: keep `size` sandboxes of this kind ready; creates with the same fields take one."""
        warm = functools.partial(service.manager.pools.warm, drain=body.drain)
        await run_in_threadpool(warm, spec_of(body), body.size)
        return {"status": "ok", "image": body.image, "size": body.size}

    @app.get("/pools")
    def pools() -> dict:
        sizes = service.manager.pools.sizes()
        return {
            "pools": [
                {"image": s.image, "block_network": s.network != "open", "network": s.network, "size": n, "ready": r}
                for s, n, r in sizes
            ]
        }

    @app.get("/sandboxes")
    def list_sandboxes() -> dict:
        return {"sandboxes": [service.describe(s) for s in service.manager.list()]}

    @app.get("/sandboxes/{sandbox_id}")
    async def get_sandbox(sandbox_id: str) -> dict:
        return await service.info(sandbox_id)

    @app.get("/sandboxes/{sandbox_id}/wait")
    async def wait_sandbox(sandbox_id: str, timeout: Annotated[float, Query(ge=0)] = 3600.0) -> Response:
        info = await service.wait(sandbox_id, timeout)
        if info["status"] == "pending":
            return JSONResponse({"detail": f"sandbox {sandbox_id} not ready within {timeout:g} s"}, 408)
        return JSONResponse(info)

    @app.delete("/sandboxes/{sandbox_id}")
    async def delete_sandbox(sandbox_id: str) -> dict:
        await service.delete(sandbox_id)
        return {"status": "deleted", "sandbox_id": sandbox_id}

    @app.post("/sandboxes/{sandbox_id}/heartbeat")
    async def heartbeat(sandbox_id: str) -> dict:
        await service.info(sandbox_id)
        await run_in_threadpool(service.manager.heartbeat, sandbox_id)
        return {"status": "ok", "sandbox_id": sandbox_id}

    @app.post("/sandboxes/{sandbox_id}/exec")
    async def exec_command(sandbox_id: str, body: ExecBody, request: Request) -> Response:
        job = await service.submit(sandbox_id, body, request.client.host if request.client else "")
        if not body.wait:
            return JSONResponse({"job_id": job.job_id, "status": "queued"})
        # JSONResponse straight away: the hot path skips response-model validation
        return JSONResponse((await service.wait_job(job.job_id, body.timeout_seconds + 30)).public())

    @app.delete("/sandboxes/{sandbox_id}/shell")
    async def close_session(sandbox_id: str, session: str = "default") -> dict:
        closed = await asend(await service.agent(sandbox_id), AgentCalls().close_session(session))
        return {"session": session, "closed": closed}

    @app.get("/jobs/{job_id}")
    async def get_job(job_id: str) -> Response:
        return JSONResponse((await service.wait_job(job_id, 0)).public())

    @app.get("/jobs/{job_id}/wait")
    async def wait_job(job_id: str, timeout: Annotated[float, Query(ge=0)] = 300.0) -> Response:
        return JSONResponse((await service.wait_job(job_id, timeout)).public())

    @app.websocket("/sandboxes/{sandbox_id}/exec/pty")
    async def pty(websocket: WebSocket, sandbox_id: str) -> None:
        key, subprotocol = websocket.query_params.get("api_key"), None
        for offered in websocket.scope.get("subprotocols", []):
            if offered.startswith("api_key."):
                key, subprotocol = offered.removeprefix("api_key."), offered
        if service.api_key is not None and not (key and hmac.compare_digest(key.encode(), service.api_key.encode())):
            await _refuse(websocket, 403, "missing or wrong API key")
            return
        try:
            agent = await service.agent(sandbox_id)
        except OrchardError as exc:  # unknown, failed or not ready
            await _refuse(websocket, 404, str(exc))
            return
        await websocket.accept(subprotocol=subprotocol)
        try:
            reader, writer = await open_agent_relay(agent.endpoint)
        except OrchardError as exc:
            await websocket.send_json({"type": "error", "message": str(exc)})
            await websocket.close()
            return
        await relay_terminal(websocket, reader, writer)

    @app.post("/sandboxes/{sandbox_id}/apply_patch")
    async def apply_patch(sandbox_id: str, body: PatchBody) -> dict:
        agent = await service.agent(sandbox_id)
        async with service.queue(sandbox_id):  # after the jobs before it, as published
            result = await asend(agent, AgentCalls().apply_patch(body.patch, body.timeout_seconds))
        return dataclasses.asdict(result)

    @app.post("/sandboxes/{sandbox_id}/http")
    async def http_request(sandbox_id: str, body: HttpBody) -> Response:
        """Extension: not queued behind the sandbox's jobs (a tool call must not wait for a command)."""
        try:
            content = None if body.body is None else base64.b64decode(body.body, validate=True)
        except ValueError:
            raise InvalidRequest("body must be base64") from None
        call = AgentCalls().http(
            body.port,
            body.path,
            method=body.method,
            body=content,
            headers=body.headers,
            timeout=body.timeout,
            max_bytes=body.max_bytes,
        )
        answer = await asend(await service.agent(sandbox_id), call)
        return JSONResponse(http_answer_json(answer))

    @app.post("/sandboxes/{sandbox_id}/files")
    async def upload(sandbox_id: str, body: FileBody) -> dict:
        try:
            data = base64.b64decode(body.content, validate=True)
        except ValueError:
            raise InvalidRequest("content must be base64") from None
        if len(data) > service.max_upload_bytes:
            raise _too_large(service.max_upload_bytes)
        agent = await service.agent(sandbox_id)
        size = await asend(agent, AgentCalls().write_file(body.path, data, body.mode))
        return {"success": True, "path": body.path, "size": size}

    @app.get("/sandboxes/{sandbox_id}/files")
    async def download(sandbox_id: str, path: str) -> dict:
        agent = await service.agent(sandbox_id)
        call = AgentCalls().read_file(path, service.max_file_read_bytes)
        advice = f"read a larger file as a tar: GET /sandboxes/{sandbox_id}/archive?path=..."
        data = await asend(agent, dataclasses.replace(call, advice=advice))
        return {"path": path, "content": base64.b64encode(data).decode(), "size": len(data)}

    @app.get("/sandboxes/{sandbox_id}/files/list")
    async def list_files(sandbox_id: str, path: str = ".") -> dict:
        entries = await asend(await service.agent(sandbox_id), AgentCalls().list_files(path))
        return {"path": path, "files": [dataclasses.asdict(e) for e in entries]}

    @app.get("/sandboxes/{sandbox_id}/archive")
    async def get_archive(sandbox_id: str, path: str) -> Response:
        """The tar, spooled to an unnamed temporary file (never held in memory), then streamed."""
        agent = await service.agent(sandbox_id)
        advice = "archive a smaller folder, or pack it in the sandbox and fetch the parts"
        with contextlib.ExitStack() as on_error:
            tar = on_error.enter_context(tempfile.TemporaryFile())
            call = AgentCalls().get_archive(path, tar, service.max_archive_read_bytes)
            await asend(agent, dataclasses.replace(call, advice=advice))
            size = tar.seek(0, os.SEEK_END)
            tar.seek(0)
            on_error.pop_all()  # from here on the response closes it
        headers = {"Content-Length": str(size)}
        return StreamingResponse(_chunks_of(tar), media_type="application/x-tar", headers=headers)

    @app.put("/sandboxes/{sandbox_id}/archive")
    async def put_archive(sandbox_id: str, path: str, request: Request) -> dict:
        tar = await request.body()
        if len(tar) > service.max_upload_bytes:
            raise _too_large(service.max_upload_bytes)
        return await asend(await service.agent(sandbox_id), AgentCalls().put_archive(path, tar))

    return app


async def _refuse(websocket: WebSocket, status: int, detail: str) -> None:
    """Refuse a WebSocket at its handshake: an HTTP answer with `detail` where the server can send
    one (uvicorn can), else a close before the accept, which is HTTP 403 (as published)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse({"detail": detail}, status))
    else:
        await websocket.close(code=4000 + status, reason=detail[:120])


def _chunks_of(file: BinaryIO) -> Iterator[bytes]:
    """A file's content in 1 MiB chunks, closing it at the end (or when the client goes)."""
    with file:
        while chunk := file.read(2**20):
            yield chunk


async def relay_terminal(websocket: WebSocket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Relay PTY frames: WebSocket messages from the client, JSON lines from the agent.

    A client that goes away closes the agent's connection, which ends the process.
    """

    async def to_agent() -> None:
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                raw = message.get("bytes") or (message.get("text") or "").encode()
                writer.write(raw.replace(b"\n", b"") + b"\n")  # valid JSON has no raw newline in strings
                await writer.drain()
        except (OSError, WebSocketDisconnect):
            return
        finally:
            writer.close()

    async def to_client() -> None:
        with contextlib.suppress(OSError, WebSocketDisconnect, RuntimeError):
            while line := await reader.readline():
                await websocket.send_text(line.decode("utf-8", "replace"))
            await websocket.close()

    client = asyncio.ensure_future(to_agent())
    try:
        await to_client()
    finally:
        client.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await client
        writer.close()


OPEN_PATHS = frozenset({"/", "/health"})
"""The only routes that need no key."""


class GuardRequests:
    """The API key and the body cap, checked before a route reads a byte of the body.

    FastAPI reads and parses a body before it solves a route's dependencies, so the key is checked
    here, from the headers alone: 401 missing, 403 wrong. A body is refused from its
    Content-Length, and one sent chunked is counted as it arrives and cut off past the cap (base64
    JSON is 4/3 larger than the upload it carries). Each refusal closes the connection, so the rest
    of the body is never read. The WebSocket route checks its key itself (browsers cannot set
    headers on one).

    A plain ASGI middleware: Starlette's BaseHTTPMiddleware would cost every request a task.
    """

    def __init__(self, app: Any, service: Service):
        self.app, self.service = app, service

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_request_id(send, _request_id(scope))
        refusal = self._refusal(scope)
        if refusal is not None:
            status, detail = refusal
            await JSONResponse({"detail": detail}, status, {"Connection": "close"})(scope, receive, send)
            return
        await self.app(scope, self._capped(receive), send)

    def _refusal(self, scope: dict) -> tuple[int, str] | None:
        key = length = None
        for name, value in scope["headers"]:
            if name == b"x-api-key":
                key = value
            elif name == b"content-length":
                length = value
        expected = self.service.api_key
        if expected is not None and scope["path"] not in OPEN_PATHS:
            if not key:
                return 401, "missing X-API-Key header"
            if not hmac.compare_digest(key, expected.encode()):
                return 403, "wrong API key"
        if length is not None and length.isdigit() and int(length) > self.limit:
            return 413, _too_large(self.service.max_upload_bytes).detail
        return None

    @property
    def limit(self) -> int:
        """Most bytes of body a request may send."""
        return self.service.max_upload_bytes * 4 // 3 + 2**16

    def _capped(self, receive: Any) -> Any:
        """`receive`, raising 413 (and closing the connection) once the body passes the cap."""
        received, limit = 0, self.limit

        async def capped() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:  # FastAPI re-raises an HTTPException from its body parsing
                too_large = _too_large(self.service.max_upload_bytes)
                raise HTTPException(413, too_large.detail, headers={"Connection": "close"})
            return message

        return capped


REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""A client's X-Request-ID we echo; any other gets a fresh one (it lands in logs and headers)."""


def _request_id(scope: dict) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if REQUEST_ID.fullmatch(text) else str(uuid.uuid4())
    return str(uuid.uuid4())


def _with_request_id(send: Any, request_id: str) -> Any:
    """`send`, adding `X-Request-ID` to the response's headers."""
    header = (b"x-request-id", request_id.encode())

    async def tagged(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), header]}
        await send(message)

    return tagged


def _too_large(limit: int) -> HTTPException:
    return HTTPException(413, f"upload too large: at most {limit / 2**20:g} MiB per request")


def _add_error_handlers(app: FastAPI) -> None:
    def detail(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"detail": message}, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def malformed(_request: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's `detail` list, as published clients read it, and our one line in `message`."""
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
            problems.append(f"{where}: {error.get('msg')}")
        errors = jsonable_encoder(exc.errors(), custom_encoder={Exception: str})
        return JSONResponse({"detail": errors, "message": "; ".join(problems)}, status_code=422)

    @app.exception_handler(OrchardError)
    async def orchard_error(_request: Request, exc: OrchardError) -> JSONResponse:
        if isinstance(exc, AuthError):  # the agent refused us: a service fault, not the caller's
            return detail(502, f"the sandbox's agent refused the service: {exc}")
        if isinstance(exc, NotFound):
            return detail(404, str(exc))
        if isinstance(exc, Conflict):
            return detail(409, str(exc))
        if isinstance(exc, TooLarge):
            return detail(413, str(exc))
        if isinstance(exc, InvalidRequest | ConfigError):
            return detail(400, str(exc))
        if isinstance(exc, Overloaded):
            return detail(503, str(exc), {"Retry-After": "1"})
        if isinstance(exc, AgentError | SandboxError | EngineUnavailable):
            return detail(502, str(exc))
        return detail(500, str(exc))

    @app.exception_handler(Exception)
    async def bug(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return detail(500, f"internal error ({type(exc).__name__}): {exc}; see the service log")


# -- running it -------------------------------------------------------------------------


def load_or_create_key() -> str:
    """The service's API key: ORCHARD_API_KEY, else one stored (0600) in ORCHARD_HOME (0700)."""
    configured = settings().api_key
    if configured:
        return configured
    path = private_folder(settings().home) / "api_key"
    if path.exists():
        return private_file(path).read_text().strip()  # tightened if an older Orchard left it wider
    key = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key


def read_key_file(path: Path) -> str:
    """The API key in `path` (a key is never passed on a command line: any user can read argv)."""
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the API key file {path}: {exc.strerror or exc}") from None
    if not key:
        raise ConfigError(f"the API key file {path} is empty; write the key in it")
    return key


def serve(
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    backend: str = "docker",
    runtime: str | None = None,
    api_key: str | None = None,
    pools: list[str] | None = None,
    options: dict[str, str | None] | None = None,
    fleet: str | None = None,
    tuning: dict[str, Any] | None = None,
) -> None:
    """Run the service in this process until SIGINT/SIGTERM; then delete every sandbox it owns.

    `pools` are `IMAGE=SIZE` warm pools (blocked network, the API's default limits); `options` set
    fields of the backend's config (`namespace`, `agent_image`, `kubeconfig` of Kubernetes). With
    `fleet`, this is one replica of that fleet (see `orchard.env.manager.Fleet`): the sandboxes
    are the fleet's and outlive it. `tuning` sets `Service` intervals (`housekeep_interval`,
    `heartbeat_silence`, `replica_silence`).
    """
    import uvicorn

    key = api_key or load_or_create_key()
    wanted = [parse_pool(p) for p in pools or []]
    where = configured_backend(backend, runtime=runtime, **(options or {}))
    check_fleet(fleet, backend, key_given=bool(api_key or settings().api_key))
    silence = (tuning or {}).get("replica_silence", REPLICA_SILENCE_SECONDS)
    shared = Fleet(fleet, key, beat_seconds=min(5.0, silence / 6)) if fleet else None
    manager = SandboxManager(where, fleet=shared).start()
    for image, size in wanted:
        manager.pools.warm(spec_of(CreateSandbox(image=image)), size)
    service = Service(manager, key, **(tuning or {}))
    config = uvicorn.Config(create_app(service), host=host, port=port, log_level="warning", **UVICORN_OPTIONS)
    described = {"name": backend, "config": where.model_dump(mode="json")}
    write_state(f"http://{host}:{port}", key, described)  # so `orchard` and the SDK find it
    service.on_close.append(remove_state)
    try:
        uvicorn.Server(config).run()
    finally:
        manager.close()
        remove_state()


def check_fleet(fleet: str | None, backend: str, key_given: bool) -> None:
    """A fleet needs a backend every replica reaches sandboxes through (not one host's sockets), and
    the key its replicas share (a key made up by one replica would serve none of the others)."""
    if fleet is None:
        return
    if not key_given:
        raise ConfigError("--fleet needs the key its replicas share: set ORCHARD_API_KEY or give --api-key-file")
    if backend != "kubernetes":
        raise ConfigError(f"--fleet needs --backend kubernetes (the {backend!r} backend's sandboxes live on one host)")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fleet):
        raise ConfigError(f"--fleet {fleet!r}: name it in lowercase letters, digits and '-', such as orchard")


KUBERNETES_FLAGS = ("namespace", "agent_image", "kubeconfig")
"""`orchard up` flags that set the Kubernetes backend's config."""


def configured_backend(backend: str, **options: str | None) -> Any:
    """The config of `backend` with `options` (the `orchard up` flags) set; a flag another backend
    owns is one clear error."""
    where = backend_config(backend)
    given = {name: value for name, value in options.items() if value is not None}
    for name in given:
        if name not in type(where).model_fields:
            raise ConfigError(f"--{name.replace('_', '-')} is not an option of the {backend!r} backend")
    try:
        return type(where).model_validate({**where.model_dump(), **given})
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "--" + str(first["loc"][0]).replace("_", "-")
        raise ConfigError(f"{flag} {given.get(str(first['loc'][0]))!r}: {first['msg']}") from None


def parse_pool(text: str) -> tuple[str, int]:
    """`IMAGE=SIZE` into its parts, with a clear error."""
    image, _, size = text.rpartition("=")
    if not image or not size.isdigit():
        raise ConfigError(f"a pool is IMAGE=SIZE, such as orchard/base:bookworm=4; not {text!r}")
    return image, int(size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m orchard.env.service", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--backend", default="docker")
    parser.add_argument("--runtime", help="OCI runtime of the Docker engine, e.g. runsc for gVisor")
    parser.add_argument("--pool", action="append", default=[], metavar="IMAGE=SIZE")
    parser.add_argument("--fleet", metavar="NAME", help="be one replica of this fleet (sharing ORCHARD_DB_URL)")
    for flag in KUBERNETES_FLAGS:
        parser.add_argument(f"--{flag.replace('_', '-')}", dest=flag)
    for knob in TUNING:
        parser.add_argument(f"--{knob.replace('_', '-')}", dest=knob, type=float, metavar="SECONDS")
    args = parser.parse_args(argv)
    options = {flag: getattr(args, flag) for flag in KUBERNETES_FLAGS}
    tuning = {knob: getattr(args, knob) for knob in TUNING if getattr(args, knob) is not None}
    serve(
        args.host,
        args.port,
        backend=args.backend,
        runtime=args.runtime,
        pools=args.pool,
        options=options,
        fleet=args.fleet,
        tuning=tuning,
    )


TUNING = ("housekeep_interval", "heartbeat_silence", "replica_silence")
"""`Service` intervals `python -m orchard.env.service` takes as flags (tests shorten them)."""


if __name__ == "__main__":
    main()

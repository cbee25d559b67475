"""A Kubernetes cluster as a sandbox backend: one Pod per sandbox, its agent reached at the Pod IP.

Each sandbox is one Pod, named `orchard-<sandbox id>` (deterministic: a create retried after a lost
answer can never make a second Pod), in the config's namespace. The API server is used only to
create, watch and delete Pods, never to run commands: commands, files and terminals go straight to
the agent at `http://<Pod IP>:7000` with the sandbox's bearer token.

Injection into an unmodified image: the init container `orchard-agent` runs the injector image
(`orchard image build-agent`: a static busybox and the agent bundle of `orchard.env.bundle`) and
copies the bundle into the `emptyDir` volume `orchard`; the main container `sandbox` is the task
image unchanged, the volume mounted read-only at `/.orchard`, its command the bundled agent
listening on TCP port 7000 at the Pod IP only (`--pod $(ORCHARD_AGENT_POD_IP):7000`, the variable
from the Downward API's `status.podIP`; never `0.0.0.0`: the Pod's loopback does not reach the
agent, and port 7000 on loopback is free for the sandbox's programs). A spec with `tools` adds a second init container, `orchard-tools`, which
runs the tools injector image (`orchard image build-tools --injector`: a static busybox and the
agent CLIs' bundle of `orchard.env.tools`) and copies the bundle into the `emptyDir` volume
`orchard-tools`, mounted read-only at `/.orchard-tools` in the main container; its size is added to
the disk cap's allowance. A readiness probe (TCP, every second) tells the kubelet when it
listens. `shareProcessNamespace` makes the Pod's pause process PID 1, which reaps the orphans
commands leave behind (Docker's `--init` does that on the Docker backend).

The token never appears in the Pod: anyone who may read Pods could read it there. The Pod's
environment holds `ORCHARD_AGENT_TOKEN_SHA256`, the hex SHA-256 of the token, and the agent
compares the SHA-256 of the token a request presents (see `orchard/env/agent/server.py`).
A fleet's token is derived, not drawn (`orchard.env.manager.Fleet.token`), from the sandbox id and
a nonce drawn at each create, which the Pod keeps in the annotation `orchard.sandbox/token-nonce`
(no secret: the fleet's key is): every replica derives the token of the Pod it finds from it
(`token_nonce`), and a sandbox id created again gets a new token, so a token learned from an
earlier sandbox of that id opens nothing.

Readiness: `state` says `running` with an `address` only once the Pod is Running, has an IP and
its main container is reported ready; the manager then checks the agent's health check at that
address before it hands the sandbox out. While the Pod is pending with nothing wrong it is
`starting`. A failure is reported at once, its reason in `message`: an image that cannot be
pulled (ErrImagePull, ImagePullBackOff, InvalidImageName), a container that cannot be made
(CreateContainerConfigError, ...), a Pod that cannot be scheduled (after `unschedulable_grace`), a
container that ended (OOMKilled, Error, with its last log lines), an eviction, a failed Pod.

One watch, no polling: a daemon thread LISTs the namespace's Orchard Pods (label
`app.kubernetes.io/managed-by=orchard`), then WATCHes from the list's resourceVersion (with
bookmarks), resuming from the last one it saw after a disconnect (backoff 0.1 s doubling to 5 s)
and listing again when the server answers 410 Gone (the version is too old). `state` and `list`
read that cache; only a miss reads one Pod directly, once. A direct read enters the cache only
when it is newer than everything the cache has seen (resourceVersions compared as the integers
etcd makes them), so a late answer never brings back a Pod the watch saw deleted.

Every API call (the watch's long request aside) runs under a semaphore of `api_concurrency` and is
retried with backoff (0.1 s doubling to 5 s, `Retry-After` honoured) on 429, 5xx, timeouts and lost
connections, for up to `retry_for` seconds.

Abandoned creates: a create that gives up without a clear answer (the server unreachable for
`retry_for`, or still answering 429/5xx) may have stored its Pod all the same (an answer lost on
the way back, a request the server finished after the client left). The caller is told it failed,
so nobody would use that Pod, and it would live until its TTL. So the backend remembers each such
create (the Pod's name, sandbox id, owner and creation time) and one thread deletes its Pod (that
very Pod: uid precondition) as soon as the API server answers again: it reads the Pod by name
until the server answers, then watches the cache (where a Pod stored late still appears) for
`LATE_CREATE` seconds more (never past the sandbox's TTL). A backend closed before then leaves it
to the reapers (its Lease gone, the Pod is an orphan; a fleet's lives to its TTL).

Policies: cpu and memory as requests = limits (Guaranteed QoS when both are set), the disk cap as
`ephemeral-storage` (plus an allowance for the injected bundle, which lies in the Pod's own
storage), tmpfs folders as `emptyDir` volumes of medium Memory with their size as `sizeLimit`
(they count against the memory limit, as on Docker). Every container: no privilege escalation,
all capabilities dropped, the runtime's default seccomp profile. The Pod: no service-account
token, no service links, restartPolicy Never, and from the config a runtime class (gVisor, Kata),
a node selector, tolerations and image-pull secrets. Not enforced here: `pids` (a Pod has no pids
field: the kubelet's `podPidsLimit` caps every Pod of a node), and the network: the label
`orchard.sandbox/network` is what the namespace's NetworkPolicies (deploy/kubernetes/) select on,
and a NetworkPolicy is only enforced by a CNI plugin that implements it. Unlike Docker's
`blocked`, a Pod always has an interface (its IP is how the agent is reached): policies make
`blocked` and `dropped` alike, and most CNIs drop what they deny, so connections out time out.

Ownership: `delete` and `state` act only on a Pod that carries Orchard's labels for that sandbox
id (and owner annotation, when given), never on one that merely has the name `orchard-<id>`.

Owners' heartbeats: an owner (an SDK process, a service) may live on any host, where no other
process can tell whether it still runs. So each owner holds a Lease (coordination.k8s.io, named
`orchard-owner-<hash of the owner>`, in the namespace) that its backend creates before its first
Pod and renews every quarter of `owner_lease` seconds, and each of its Pods names that Lease in the
annotation `orchard.sandbox/lease`. A Pod whose Lease is gone or was not renewed for `owner_lease`
seconds is an orphan (`orphaned`) that any manager reaps, on any host: its owner was killed, or
lost its host or its network. A backend that closes deletes its Leases. A Lease no live Pod names
any more is swept (`sweep`, each reaping round, the first when a manager starts, as `orchard
down` starts one): at once when its holder is an owner of this host whose process is gone (a
service SIGKILLed: `orchard.process.owner_alive` can tell), else once it lapsed more than twice
its duration ago by its renewTime. Pods this backend just deleted name nothing any more, even
before the watch reports them going. A fleet (owner `fleet:`)
holds none: its sandboxes outlive replicas, and their TTL and heartbeats reap them. A reader
times a Lease's silence on its own monotonic clock (how long its renewTime has not changed), so
hosts' clocks need not agree; a reader that just started waits a Lease's duration before it judges.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard import __version__
from orchard.env.agent.protocol import AGENT_ENV_PREFIX, TOKEN_SHA256_ENV
from orchard.env.backends.base import LABEL_PREFIX, AgentEndpoint, BackendSandbox, SandboxSpec, SandboxState
from orchard.errors import AuthError, ConfigError, Conflict, EngineUnavailable, NotFound, SandboxError
from orchard.process import owner_alive

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from orchard.env.bundle import Bundle
    from orchard.env.tools import ToolsBundle

AGENT_MOUNT = "/.orchard"
AGENT_PORT = 7000
AGENT_VOLUME = "orchard"
INIT_CONTAINER = "orchard-agent"
MAIN_CONTAINER = "sandbox"
INJECT_COMMAND = ["/bin/busybox", "cp", "-a", "/orchard-bundle/.", f"{AGENT_MOUNT}/"]
"""The init container's command: the injector image holds a static busybox and the bundle."""
TOOLS_CONTAINER = "orchard-tools"
TOOLS_VOLUME = "orchard-tools"
TOOLS_MOUNT = "/.orchard-tools"
"""Where a spec with `tools` gets the agent CLIs (`orchard.env.tools.TOOLS_MOUNT`)."""
INJECT_TOOLS = ["/bin/busybox", "cp", "-a", "/orchard-tools/.", f"{TOOLS_MOUNT}/"]
"""The tools init container's command (`orchard.env.tools.INJECT_TOOLS`)."""
POD_IP_ENV = f"{AGENT_ENV_PREFIX}POD_IP"
"""The main container's variable holding the Pod IP (the Downward API's `status.podIP`), where the agent listens."""

MANAGED_BY = "app.kubernetes.io/managed-by"
ID_LABEL = "orchard.sandbox/id"
NETWORK_LABEL = "orchard.sandbox/network"
RUN_KEY = "orchard.sandbox/run"
"""A label when the run id is a valid label value, and always an annotation (any text)."""
OWNER_ANNOTATION = "orchard.sandbox/owner"
LEASE_ANNOTATION = "orchard.sandbox/lease"
"""The owner's Lease (see the module's docstring)."""
CREATED_ANNOTATION = "orchard.sandbox/created"
TTL_ANNOTATION = "orchard.sandbox/ttl"
NONCE_ANNOTATION = "orchard.sandbox/token-nonce"
"""A fleet's Pod: the nonce its agent token is derived from (see the module's docstring)."""
SELECTOR = f"{MANAGED_BY}=orchard"

FAILED_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
"""Waiting reasons of a container that will not start by waiting longer (as Orchard sees it: a
pull error may be a registry's hiccup, but a sandbox that waits on a backoff is no use either)."""
UNSCHEDULABLE = ("PodScheduled", "False", "Unschedulable")
"""The condition (type, status, reason) the scheduler sets on a Pod no node can take."""
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
WATCH_SECONDS = 60
"""How long one watch request lasts on the server's side before it is renewed from its resourceVersion."""
LIST_PAGE = 500
LATE_CREATE = 300.0
"""Seconds after the API server answers again that an abandoned create's Pod is still looked for (a
write the server finished late); see the module's docstring."""
MAX_BACKOFF = 5.0
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_MIB = 1 << 20

log = logging.getLogger("orchard.env")


class Toleration(BaseModel):
    """A Pod toleration, as Kubernetes spells it (`tolerationSeconds` included)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")


class KubernetesConfig(BaseModel):
    """Sandboxes as Pods of a Kubernetes cluster, reached at their Pod IPs."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["kubernetes"] = "kubernetes"
    namespace: str = Field(default="orchard-sandboxes", description="Namespace of the sandbox Pods (it must exist).")
    kubeconfig: Path | None = Field(
        default=None,
        description="Kubeconfig file; default: the Pod's service account inside a cluster, else "
        "$KUBECONFIG or ~/.kube/config.",
    )
    context: str | None = Field(default=None, description="Kubeconfig context; default: its current one.")
    agent_image: str = Field(
        default=f"orchard/agent:{__version__}",
        description="The injector image (`orchard image build-agent`), pushed where the cluster pulls from.",
    )
    tools_image: str = Field(
        default=f"orchard/tools:{__version__}",
        description="The agent CLIs' injector image (`orchard image build-tools --injector`), for sandboxes "
        "created with tools; pushed where the cluster pulls from.",
    )
    runtime_class: str | None = Field(
        default=None, description="RuntimeClass of the Pods, e.g. `gvisor` or `kata`; default: the node's runtime."
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the Pods must run on.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints the Pods tolerate.")
    image_pull_secrets: list[str] = Field(
        default_factory=list, description="Names of Secrets (in the namespace) to pull images with."
    )
    api_concurrency: int = Field(default=16, ge=1, description="Most API calls in flight at once.")
    timeout: float = Field(default=30.0, gt=0, description="Seconds to wait for one API call.")
    retry_for: float = Field(
        default=60.0, ge=0, description="Seconds a failing API call (429, 5xx, timeout) is retried before it fails."
    )
    unschedulable_grace: float = Field(
        default=5.0,
        ge=0,
        description="Seconds a Pod may stay unschedulable before the sandbox fails (longer where a "
        "cluster autoscaler adds nodes).",
    )
    owner_lease: float = Field(
        default=40.0,
        ge=2,
        description="Seconds an owner's Lease lasts unrenewed (renewed every quarter of it); its Pods "
        "are orphans, reaped by any other owner, once it lapses.",
    )

    def build(self) -> KubernetesBackend:
        """Connect to the API server (the kubernetes package is imported only now)."""
        return KubernetesBackend(self)


class ApiRefused(SandboxError):
    """The API server answered with an error status (after retries, for a transient one)."""

    def __init__(self, status: int, reason: str, message: str, attempts: int = 1):
        super().__init__(f"{message} ({status} {reason})" if message else f"{status} {reason}")
        self.status, self.reason, self.detail, self.attempts = status, reason, message, attempts


class KubernetesBackend:
    """Lifecycle of sandbox Pods in one namespace of a cluster. Thread-safe."""

    name = "kubernetes"

    def __init__(self, config: KubernetesConfig | None = None):
        from orchard.env.bundle import build_bundle

        self.config = config or KubernetesConfig()
        self.namespace = self.config.namespace
        self._client = _api_client(self.config)
        self._slots = threading.BoundedSemaphore(self.config.api_concurrency)
        self.bundle = build_bundle()
        self._unschedulable_since: dict[str, float] = {}
        """When `state` first saw each Pod (by uid) unschedulable (monotonic seconds)."""
        self._unschedulable_lock = threading.Lock()
        self._cache = _PodCache(self)
        self._leases = _OwnerLeases(self)
        self._abandoned: dict[str, _Abandoned] = {}
        """Creates given up without a clear answer, by Pod name (see the module's docstring)."""
        self._abandoned_lock = threading.Lock()
        self._janitor: threading.Thread | None = None
        self._closing = threading.Event()
        try:
            self._cache.start()
        except BaseException:
            self._client.close()
            raise

    # -- lifecycle --------------------------------------------------------------------

    def pod_name(self, sandbox_id: str) -> str:
        return pod_name(sandbox_id)

    def create(self, sandbox_id: str, spec: SandboxSpec, token: str, *, nonce: str = "") -> AgentEndpoint:
        """Create the Pod; it is scheduled and started after this returns, its address not known yet.

        `nonce`: what a fleet's `token` was derived from, kept in the Pod (`token_nonce`).

        A create whose answer was lost and that is retried finds its own Pod (same owner and creation
        time) and takes it; any other Pod of that name is a Conflict.
        """
        manifest = self.pod_manifest(sandbox_id, spec, token, nonce=nonce)
        lease = self._leases.hold(spec.owner)
        if lease is not None:
            manifest["metadata"]["annotations"][LEASE_ANNOTATION] = lease
        created = manifest["metadata"]["annotations"][CREATED_ANNOTATION]
        try:
            pod = self._call("POST", self._pods_path(), body=manifest, what=f"create Pod {self.pod_name(sandbox_id)}")
        except EngineUnavailable:  # the Pod may have been stored all the same: removed once the server is back
            self._abandon(sandbox_id, spec, created)
            raise
        except ApiRefused as exc:
            if exc.status in RETRY_STATUSES:  # e.g. a 504: the server may still store it
                self._abandon(sandbox_id, spec, created)
            if exc.status == 409 and exc.attempts > 1:  # an earlier attempt may have made it
                found = self._read_pod(self.pod_name(sandbox_id))
                if (
                    found is not None
                    and _is_sandbox(found, sandbox_id, spec.owner)
                    and _annotations(found).get(CREATED_ANNOTATION) == created
                ):
                    self._cache.offer(found)
                    return AgentEndpoint(token=token, url="")
            raise self._create_error(sandbox_id, spec, exc) from None
        self._cache.offer(pod)
        return AgentEndpoint(token=token, url="")

    def dry_run(self, sandbox_id: str, spec: SandboxSpec, token: str = "dry-run") -> dict[str, Any]:
        """Have the API server validate and admit the Pod of `create` without storing it (`dryRun=All`).

        Returns the Pod as it would be stored (defaults filled in); an invalid manifest raises its error.
        """
        manifest = self.pod_manifest(sandbox_id, spec, token)
        try:
            return self._call("POST", self._pods_path(), query=[("dryRun", "All")], body=manifest, what="dry-run a Pod")
        except ApiRefused as exc:
            raise self._create_error(sandbox_id, spec, exc) from None

    def state(self, sandbox_id: str) -> SandboxState:
        """Running (with the agent's address), starting, failed (with the reason) or gone, from the cache."""
        pod = self._find(sandbox_id)
        if pod is None or not _is_sandbox(pod, sandbox_id):
            return SandboxState(running=False, exists=False, message="the Pod is gone")
        uid = pod["metadata"].get("uid", "")
        with self._unschedulable_lock:
            if _unschedulable(pod) is None:
                self._unschedulable_since.pop(uid, None)
                waited = 0.0
            else:
                waited = time.monotonic() - self._unschedulable_since.setdefault(uid, time.monotonic())
        return pod_state(pod, unschedulable_grace=self.config.unschedulable_grace - waited)

    def token_nonce(self, sandbox_id: str) -> str | None:
        """The nonce the sandbox's Pod was created with (its fleet's token is derived from it): ""
        for a Pod made without one, None when there is no such sandbox."""
        pod = self._find(sandbox_id)
        if pod is None or not _is_sandbox(pod, sandbox_id):
            return None
        return _annotations(pod).get(NONCE_ANNOTATION, "")

    def wait_for_change(self, sandbox_id: str, state: SandboxState, timeout: float) -> None:
        """Block until the sandbox's state differs from `state` (the watch wakes it), at most `timeout` s."""
        changed = threading.Event()
        name = self.pod_name(sandbox_id)
        self._cache.add_waiter(name, changed)
        try:
            if self.state(sandbox_id) == state:
                changed.wait(timeout)
        finally:
            self._cache.remove_waiter(name, changed)

    def seal(self, sandbox_id: str) -> None:
        """Nothing to seal: no folder of this host is shared with a Pod (the agent listens on TCP in it)."""

    def delete(self, sandbox_id: str, owner: str | None = None) -> None:
        """Delete the sandbox's Pod (grace period 1 s; its emptyDir volumes go with it). Idempotent.

        Only a Pod labelled as Orchard's sandbox `sandbox_id` (annotated with `owner`, when given)
        is deleted, and only that very Pod (a uid precondition); a Pod that merely has the name
        `orchard-<id>`, or another owner's sandbox, is left alone: both raise NotFound.
        """
        name = self.pod_name(sandbox_id)
        for _ in range(3):  # a Pod replaced between the look and the delete is looked at anew
            pod = self._find(sandbox_id)
            if pod is None:
                return
            if not _is_sandbox(pod, sandbox_id, owner):
                whose = "another owner's sandbox" if _is_sandbox(pod, sandbox_id) else "not Orchard's"
                raise NotFound(f"no sandbox {sandbox_id!r} here: the Pod {name} is {whose}; left alone")
            options = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": 1,
                "preconditions": {"uid": pod["metadata"]["uid"]},
            }
            try:
                self._call(
                    "DELETE", f"{self._pods_path()}/{name}", body=options, what=f"delete Pod {name}", answer=False
                )
            except ApiRefused as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:  # 409: the uid differs, another Pod of that name now
                    raise SandboxError(f"Kubernetes could not delete the Pod {name}: {exc}") from None
                self._cache.forget(name)
                continue
            self._cache.deleting(name, pod["metadata"]["uid"])
            with self._unschedulable_lock:
                self._unschedulable_since.pop(pod["metadata"].get("uid", ""), None)
            return
        raise SandboxError(f"the Pod {name} kept being replaced while it was deleted; try again")

    def list(self) -> list[BackendSandbox]:
        """Every Orchard sandbox Pod of the namespace not being deleted, from the cache."""
        pods = self._cache.pods()
        live = {pod["metadata"].get("uid") for pod in pods}
        with self._unschedulable_lock:  # forget Pods gone by other ways than `delete`
            for uid in [uid for uid in self._unschedulable_since if uid not in live]:
                del self._unschedulable_since[uid]
        return [
            BackendSandbox(sandbox_id=pod["metadata"]["labels"][ID_LABEL], labels=_sandbox_labels(pod))
            for pod in pods
            if ID_LABEL in (pod["metadata"].get("labels") or {}) and not pod["metadata"].get("deletionTimestamp")
        ]

    def orphaned(self, found: BackendSandbox) -> bool:
        """Whether the sandbox's owner let its Lease lapse (or deleted it): see the module's docstring."""
        lease = found.labels.get(LABEL_PREFIX + "lease")
        return lease is not None and self._leases.lapsed(lease)

    def sweep(self) -> None:
        """Delete the Leases that no live Pod names any more and whose owners are gone (an owner of
        this host whose process is gone, or any whose Lease lapsed long ago): see the module's docstring."""
        named = {sandbox.labels.get(LABEL_PREFIX + "lease") for sandbox in self.list()}
        self._leases.sweep(named)

    def close(self) -> None:
        """Give up this backend's Leases (its owners' remaining Pods become orphans), stop the watch
        and the clean-up of abandoned creates, and close the connection pool."""
        self._closing.set()
        janitor = self._janitor
        if janitor is not None:
            janitor.join(timeout=5)
        self._leases.close()
        self._cache.stop()
        self._client.close()

    # -- abandoned creates -------------------------------------------------------------

    def abandoned(self) -> builtins.list[str]:
        """The names of the Pods of abandoned creates still looked for (see the module's docstring)."""
        with self._abandoned_lock:
            return sorted(self._abandoned)

    def _abandon(self, sandbox_id: str, spec: SandboxSpec, created: str) -> None:
        """Remember a create given up without a clear answer; its Pod, if stored, is deleted once the server answers."""
        name = self.pod_name(sandbox_id)
        log.warning("gave up creating the Pod %s; it is deleted if the API server stored it", name)
        with self._abandoned_lock:
            self._abandoned[name] = _Abandoned(sandbox_id, spec.owner, created, time.monotonic() + spec.ttl)
            if self._janitor is None and not self._closing.is_set():
                self._janitor = threading.Thread(target=self._clean_abandoned, daemon=True, name="orchard-abandoned")
                self._janitor.start()

    def _clean_abandoned(self) -> None:
        """The thread deleting abandoned creates' Pods, every half second until none is left."""
        while not self._closing.wait(0.5):
            with self._abandoned_lock:
                pending = dict(self._abandoned)
                if not pending:
                    self._janitor = None
                    return
            for name, create in pending.items():
                try:
                    done = self._clean_one(name, create)
                except Exception as exc:  # the server still away, or a hiccup: the next round tries again
                    log.debug("abandoned create of %s: %s", name, exc)
                    continue
                if done or time.monotonic() > create.until:
                    with self._abandoned_lock:
                        if self._abandoned.get(name) is create:
                            del self._abandoned[name]

    def _clean_one(self, name: str, create: _Abandoned) -> bool:
        """One look at an abandoned create: True once nothing is left to do for it."""
        pod = self._cache.get(name)
        if pod is None and create.answered is None:  # one try: the server may still be away
            try:
                pod = self._call("GET", f"{self._pods_path()}/{name}", what=f"read Pod {name}", retry_for=0)
            except ApiRefused as exc:
                if exc.status != 404:
                    raise
            create.answered = time.monotonic()
            create.until = min(create.until, create.answered + LATE_CREATE)
        if pod is None:
            return False
        notes = _annotations(pod)
        if not _is_sandbox(pod, create.sandbox_id, create.owner) or notes.get(CREATED_ANNOTATION) != create.created:
            return True  # another create's Pod (or not Orchard's): not this one to delete
        if pod["metadata"].get("deletionTimestamp"):
            return True
        uid = pod["metadata"]["uid"]
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 1, "preconditions": {"uid": uid}}
        try:
            self._call("DELETE", f"{self._pods_path()}/{name}", body=options, what=f"delete Pod {name}", retry_for=0)
        except ApiRefused as exc:
            if exc.status not in (404, 409):  # 409: not that Pod any more
                raise
        self._cache.deleting(name, uid)
        log.info("deleted the Pod %s of an abandoned create", name)
        return True

    # -- the Pod ----------------------------------------------------------------------

    def pod_manifest(self, sandbox_id: str, spec: SandboxSpec, token: str, *, nonce: str = "") -> dict[str, Any]:
        """The Pod `create` sends for the sandbox (see `pod_manifest`); a spec with `tools` builds
        the tools bundle here the first time (its size is the disk allowance), a cache hit after."""
        from orchard.env.tools import build_tools

        tools = build_tools() if spec.tools else None
        return pod_manifest(sandbox_id, spec, token, config=self.config, bundle=self.bundle, tools=tools, nonce=nonce)

    # -- helpers ----------------------------------------------------------------------

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    def _find(self, sandbox_id: str) -> dict | None:
        """The Pod named after the sandbox, whoever made it: from the cache, else read once."""
        name = self.pod_name(sandbox_id)
        pod = self._cache.get(name)
        if pod is None:
            pod = self._read_pod(name)
            if pod is not None:
                self._cache.offer(pod)
        return pod

    def _read_pod(self, name: str) -> dict | None:
        try:
            return self._call("GET", f"{self._pods_path()}/{name}", what=f"read Pod {name}")
        except ApiRefused as exc:
            if exc.status == 404:
                return None
            raise

    def _create_error(self, sandbox_id: str, spec: SandboxSpec, exc: ApiRefused) -> Exception:
        if exc.status == 409:
            return Conflict(f"sandbox id {sandbox_id!r} is already in use in the Kubernetes namespace {self.namespace}")
        if exc.status == 404 and "namespace" in exc.detail:
            return ConfigError(
                f"the Kubernetes namespace {self.namespace!r} does not exist; create it "
                "(`kubectl apply -f deploy/kubernetes/`) or set the backend's namespace"
            )
        if exc.status in (401, 403):
            return _auth_error(exc, f"create Pods in namespace {self.namespace}")
        return SandboxError(f"Kubernetes refused the Pod of {spec.image!r}: {exc}")

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: builtins.list[tuple[str, str]] | None = None,
        body: dict | None = None,
        what: str,
        retry_for: float | None = None,
        content_type: str = "application/json",
        answer: bool = True,
    ) -> dict:
        """One API call, JSON both ways, under the concurrency limit; retried on 429, 5xx and lost connections.

        Without `answer` the answer is not parsed ({} is returned): a Pod's JSON costs CPU to decode.

        ApiRefused for an error answer (after the retries for a transient one); EngineUnavailable
        when the server stays unreachable for `retry_for` seconds (the config's by default).
        """
        import urllib3

        deadline = time.monotonic() + (self.config.retry_for if retry_for is None else retry_for)
        delay, attempts = 0.1, 0
        while True:
            attempts += 1
            refused, retry_after = None, None
            try:
                with self._slots:
                    response = self._send(
                        method, path, query, body, timeout=self.config.timeout, content_type=content_type
                    )
                    data = response.read()
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if 200 <= response.status < 300:
                    return json.loads(data) if data and answer else {}
                refused = _refusal(response.status, response.reason, data, attempts)
                if response.status not in RETRY_STATUSES:
                    raise refused
                problem = str(refused)
                retry_after = _seconds(response.headers.get("Retry-After"))
            wait = min(max(delay, retry_after or 0.0), MAX_BACKOFF * 6)
            if time.monotonic() + wait > deadline:
                if refused is not None:
                    raise refused
                raise EngineUnavailable(
                    f"the Kubernetes API server at {self._client.configuration.host} did not answer "
                    f"({what}): {problem}; check the kubeconfig's server and context"
                )
            log.debug("Kubernetes API: %s failed (%s); retrying in %.1f s", what, problem, wait)
            time.sleep(wait)
            delay = min(delay * 2, MAX_BACKOFF)

    def _send(
        self,
        method: str,
        path: str,
        query: builtins.list[tuple[str, str]] | None,
        body: dict | None,
        timeout: Any,
        content_type: str = "application/json",
    ) -> Any:
        """Send one request (auth applied as the kubeconfig says); the answer unread (urllib3's, streamable)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self._client.param_serialize(
            method, path, query_params=query or None, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        return self._client.call_api(*request, _request_timeout=timeout)


class _Abandoned:
    """A create given up without a clear answer (see the module's docstring)."""

    def __init__(self, sandbox_id: str, owner: str, created: str, until: float):
        self.sandbox_id, self.owner, self.created = sandbox_id, owner, created
        self.until = until
        """When (monotonic) to stop looking for its Pod."""
        self.answered: float | None = None
        """When (monotonic) the server first answered about it; until then the Pod is read directly."""


class _PodCache:
    """The namespace's Orchard Pods by name, kept by one LIST+WATCH thread. Thread-safe."""

    def __init__(self, backend: KubernetesBackend):
        self.backend = backend
        self._pods: dict[str, dict] = {}
        self._version = ""
        """The resourceVersion the cache is current to: the last list's, or the last event's."""
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._stopped = threading.Event()
        self._response: Any = None
        self.expired = 0
        """How many times the watch's resourceVersion expired (410) and the cache was listed anew."""
        self._thread = threading.Thread(target=self._run, daemon=True, name="orchard-kube-watch")

    def start(self) -> None:
        """List now (so a start finds every sandbox; an unreachable server fails here), then watch."""
        self._relist(retry_for=min(self.backend.config.retry_for, 10.0))
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # unblock the watch's read; it may be closing anyway
                response.shutdown()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def get(self, name: str) -> dict | None:
        with self._lock:
            return self._pods.get(name)

    def pods(self) -> list[dict]:
        with self._lock:
            return list(self._pods.values())

    def offer(self, pod: dict) -> None:
        """Take a Pod read directly, if it is newer than all the cache has seen (else the watch knows better).

        Only an Orchard Pod (the watch's label): the watch would never tell the end of another.
        """
        version = _version(pod)
        if (pod["metadata"].get("labels") or {}).get(MANAGED_BY) != "orchard":
            return
        with self._lock:
            current = _version_number(self._version)
            if version is None or current is None or version <= current:
                return
            known = self._pods.get(pod["metadata"]["name"])
            if known is not None and (_version(known) or 0) >= version:
                return
            self._pods[pod["metadata"]["name"]] = pod
            self._notify(pod["metadata"]["name"])

    def deleting(self, name: str, uid: str) -> None:
        """Mark the Pod `name` (if it is still the one of `uid`) as being deleted, as the watch will
        soon report it: `list` and `sweep` no longer count it (the watch's next word replaces it)."""
        with self._lock:
            known = self._pods.get(name)
            if known is None or known["metadata"].get("uid") != uid or known["metadata"].get("deletionTimestamp"):
                return
            marked = {**known, "metadata": {**known["metadata"], "deletionTimestamp": _now_rfc3339()}}
            self._pods[name] = marked
            self._notify(name)

    def forget(self, name: str) -> None:
        """Drop a Pod known to be stale (its next read is direct); the watch brings it back if it is there."""
        with self._lock:
            self._pods.pop(name, None)

    def add_waiter(self, name: str, event: threading.Event) -> None:
        with self._lock:
            self._waiters.setdefault(name, set()).add(event)

    def remove_waiter(self, name: str, event: threading.Event) -> None:
        with self._lock:
            waiting = self._waiters.get(name)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[name]

    def _notify(self, name: str | None) -> None:
        """Wake who waits on Pod `name` (None: everyone). Called with the lock held."""
        for waiting in self._waiters.values() if name is None else [self._waiters.get(name, set())]:
            for event in waiting:
                event.set()

    # the watch thread

    def _run(self) -> None:
        delay = 0.1
        relist = False
        while not self._stopped.is_set():
            started = time.monotonic()
            try:
                if relist:
                    self._relist()
                    relist = False
                self._watch()
            except _Expired:
                log.info("the Pod watch's resourceVersion expired (410); listing again")
                self.expired += 1
                relist = True
                continue
            except Exception as exc:  # any way of losing the server: resume from the last version
                if self._stopped.is_set():
                    return
                if time.monotonic() - started > 10:
                    delay = 0.1  # a watch that ran a while was healthy: start the backoff over
                log.warning("the Pod watch failed (%s: %s); resuming in %.1f s", type(exc).__name__, exc, delay)
                self._stopped.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF)
            else:
                delay = 0.1

    def _relist(self, retry_for: float | None = None) -> None:
        """Replace the cache with a fresh LIST (paged), consistent at the list's resourceVersion."""
        pods: dict[str, dict] = {}
        query = [("labelSelector", SELECTOR), ("limit", str(LIST_PAGE))]
        version, token = "", ""
        while True:
            try:
                page = self.backend._call(
                    "GET",
                    self.backend._pods_path(),
                    query=query + ([("continue", token)] if token else []),
                    what="list Pods",
                    retry_for=retry_for,
                )
            except ApiRefused as exc:
                if exc.status == 410 and token:  # the continue token expired: start over
                    pods, version, token = {}, "", ""
                    continue
                if exc.status in (401, 403):
                    raise _auth_error(exc, f"list Pods in namespace {self.backend.namespace}") from None
                raise
            for pod in page.get("items") or []:
                pods[pod["metadata"]["name"]] = pod
            version = version or page["metadata"].get("resourceVersion", "")
            token = page["metadata"].get("continue") or ""
            if not token:
                break
        with self._lock:
            self._pods, self._version = pods, version
            self._notify(None)

    def _watch(self) -> None:
        """One watch request from the cache's resourceVersion, applied event by event until it ends."""
        query = [
            ("labelSelector", SELECTOR),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", self._version),
            ("timeoutSeconds", str(WATCH_SECONDS)),
        ]
        config = self.backend.config
        response = self.backend._send(
            "GET", self.backend._pods_path(), query, None, timeout=(config.timeout, WATCH_SECONDS + 30)
        ).response
        self._response = response
        try:
            if self._stopped.is_set():
                return
            if response.status != 200:
                refused = _refusal(response.status, response.reason, response.data, 1)
                if response.status == 410:
                    raise _Expired()
                raise refused
            for line in _lines(response):
                self._apply(json.loads(line))
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                response.close()
                response.release_conn()

    def _apply(self, event: dict) -> None:
        kind, pod = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if pod.get("code") == 410:
                raise _Expired()
            raise ApiRefused(int(pod.get("code") or 0), pod.get("reason") or "", pod.get("message") or "watch error")
        version = (pod.get("metadata") or {}).get("resourceVersion", "")
        with self._lock:
            if kind != "BOOKMARK":
                name = pod["metadata"]["name"]
                if kind == "DELETED":
                    self._pods.pop(name, None)
                else:
                    known = self._pods.get(name)
                    if known is None or (_version(known) or 0) <= (_version(pod) or 0):  # never step back
                        self._pods[name] = pod
                self._notify(name)
            if version:
                self._version = version


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


# -- the Pod ---------------------------------------------------------------------------


class _OwnerLeases:
    """The Leases of the owners this backend creates Pods for, renewed by one thread; and a look at
    other owners' Leases. Thread-safe."""

    def __init__(self, backend: KubernetesBackend):
        self._backend = backend
        self._held: dict[str, str] = {}
        """owner -> the name of its Lease"""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[str, tuple[float, dict | None, str | None, float]] = {}
        """Other owners' Leases as last read: when (monotonic), the Lease (None: gone), its
        renewTime, and when (monotonic) this backend first saw that renewTime."""

    @property
    def _path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self._backend.namespace}/leases"

    def hold(self, owner: str) -> str | None:
        """The name of `owner`'s Lease, written now if this backend does not hold it yet; None for a
        fleet (or no owner), which holds no Lease."""
        if not owner or owner.startswith("fleet:"):
            return None
        with self._lock:  # the first Pod of an owner waits for its Lease; the others do not
            name = self._held.get(owner)
            if name is None:
                name = lease_name(owner)
                self._write(name, owner)
                self._held[owner] = name
                if self._thread is None:
                    self._thread = threading.Thread(target=self._renew_forever, daemon=True, name="orchard-leases")
                    self._thread.start()
        return name

    def lapsed(self, name: str) -> bool:
        """Whether the Lease `name` (not ours) is gone, or was not renewed for its duration.

        Renewal is judged by this host's monotonic clock: how long the Lease's `renewTime` has
        stayed as this backend last saw it change, never the owner's clock against this one's. So a
        Lease seen for the first time is not lapsed yet, whatever its times say.
        """
        with self._lock:
            if name in self._held.values():
                return False
            seen = self._seen.get(name)
        now = time.monotonic()
        if seen is None or now - seen[0] > self._seconds / 4:  # a reaping round reads each Lease once
            lease = self._read(name)
            renewed = (lease or {}).get("spec", {}).get("renewTime")
            changed = seen[3] if seen is not None and seen[2] == renewed and seen[1] is not None else now
            seen = (now, lease, renewed, changed)
            with self._lock:
                self._seen[name] = seen
        _, lease, _, changed = seen
        return lease is None or now - changed > _lease_duration(lease)

    def sweep(self, named: set[str | None]) -> None:
        """Delete Orchard's Leases that no Pod names (`named`: those live Pods name) and whose
        holder is an owner of this host whose process is gone, or that lapsed more than twice
        their duration ago (by their renewTime: an owner on another host)."""
        with self._lock:
            held = set(self._held.values())
        found = self._backend._call("GET", self._path, query=[("labelSelector", SELECTOR)], what="list Leases")
        listed = {lease["metadata"]["name"] for lease in found.get("items") or []}
        with self._lock:  # forget what was seen of Leases that are gone
            for name in [name for name in self._seen if name not in listed]:
                del self._seen[name]
        for lease in found.get("items") or []:
            name = lease["metadata"]["name"]
            if name in held or name in named:
                continue
            holder = (lease.get("spec") or {}).get("holderIdentity") or ""
            if owner_alive(holder) and _lease_age(lease) <= 2 * _lease_duration(lease):
                continue
            self._delete(name, lease["metadata"].get("uid"), lease["metadata"].get("resourceVersion"))

    def close(self) -> None:
        """Stop renewing and delete the Leases held (best effort: an unreachable server lets them lapse)."""
        self._stop.set()
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for name in held:
            try:
                self._delete(name)
            except Exception:  # they lapse on their own
                log.warning("could not delete the Lease %s; it lapses in %.0f s", name, self._seconds)

    @property
    def _seconds(self) -> float:
        return self._backend.config.owner_lease

    def _renew_forever(self) -> None:
        while not self._stop.wait(self._seconds / 4):
            with self._lock:
                held = dict(self._held)
            for owner, name in held.items():
                try:
                    self._write(name, owner)
                except Exception:  # the server may be briefly away: the next round tries again
                    log.warning("could not renew the Lease %s", name, exc_info=True)

    def _write(self, name: str, owner: str) -> None:
        """Renew the Lease (a merge patch: a Lease takes no unconditional replace), or create it."""
        spec = {"holderIdentity": owner, "leaseDurationSeconds": max(1, math.ceil(self._seconds))}
        spec["renewTime"] = _micro_time(time.time())
        try:
            self._backend._call(
                "PATCH",
                f"{self._path}/{name}",
                body={"spec": spec},
                content_type="application/merge-patch+json",
                what=f"renew Lease {name}",
            )
        except ApiRefused as exc:
            if exc.status in (401, 403):
                raise _auth_error(exc, f"write Leases in namespace {self._backend.namespace}") from None
            if exc.status != 404 or self._stop.is_set():  # gone because this backend closed: leave it so
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "labels": {MANAGED_BY: "orchard"}},
                "spec": spec,
            }
            self._backend._call("POST", self._path, body=body, what=f"create Lease {name}")

    def _read(self, name: str) -> dict | None:
        try:
            return self._backend._call("GET", f"{self._path}/{name}", what=f"read Lease {name}")
        except ApiRefused as exc:
            if exc.status == 404:
                return None
            raise

    def _delete(self, name: str, uid: str | None = None, version: str | None = None) -> None:
        """Delete a Lease; with `uid` and `version`, only that Lease as it was read (not one renewed since)."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid, **({"resourceVersion": version} if version else {})}
        try:
            self._backend._call("DELETE", f"{self._path}/{name}", body=options, what=f"delete Lease {name}")
        except ApiRefused as exc:
            if exc.status not in (404, 409):
                raise


def lease_name(owner: str) -> str:
    """The Lease of an owner: `orchard-owner-` and 16 hex digits of the owner's SHA-256."""
    return f"orchard-owner-{hashlib.sha256(owner.encode()).hexdigest()[:16]}"


def _now_rfc3339() -> str:
    """Now as Kubernetes' Time (RFC 3339, seconds, UTC)."""
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_time(seconds: float) -> str:
    """Kubernetes' MicroTime (RFC 3339, microseconds, UTC)."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _lease_age(lease: dict) -> float:
    """Seconds since the Lease was last renewed (infinite when it never was)."""
    text = (lease.get("spec") or {}).get("renewTime") or ""
    try:
        renewed = datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    except ValueError:
        return math.inf
    return time.time() - renewed.timestamp()


def _lease_duration(lease: dict) -> float:
    return float((lease.get("spec") or {}).get("leaseDurationSeconds") or 0)


def pod_name(sandbox_id: str) -> str:
    """`orchard-<sandbox id>`: deterministic, so a retried create cannot make a second Pod."""
    return f"orchard-{sandbox_id}"


def pod_manifest(
    sandbox_id: str,
    spec: SandboxSpec,
    token: str,
    *,
    config: KubernetesConfig,
    bundle: Bundle,
    created: float | None = None,
    tools: ToolsBundle | None = None,
    nonce: str = "",
) -> dict[str, Any]:
    """The Pod of a sandbox (see the module's docstring): it holds the token's SHA-256, never the token.

    A spec with `tools` needs `tools`, the bundle the config's `tools_image` holds (for its size).

    `created` (unix seconds, default now) is the creation time its annotation records; `nonce`, when
    given, what a fleet's token was derived from (annotation `orchard.sandbox/token-nonce`). The command
    and the environment's values reach the container as given (escaped from Kubernetes' `$(VAR)`).
    """
    labels = {MANAGED_BY: "orchard", ID_LABEL: sandbox_id, NETWORK_LABEL: spec.network}
    annotations = {
        OWNER_ANNOTATION: spec.owner,
        CREATED_ANNOTATION: f"{time.time() if created is None else created:.3f}",
        TTL_ANNOTATION: f"{spec.ttl:.0f}",
    }
    if nonce:
        annotations[NONCE_ANNOTATION] = nonce
    if spec.run_id:
        annotations[RUN_KEY] = spec.run_id
        if len(spec.run_id) <= 63 and _LABEL_VALUE.fullmatch(spec.run_id):
            labels[RUN_KEY] = spec.run_id
    environment = {k: v for k, v in spec.env.items() if not k.startswith(AGENT_ENV_PREFIX)}
    environment |= bundle.environment(AGENT_MOUNT)
    environment[TOKEN_SHA256_ENV] = hashlib.sha256(token.encode()).hexdigest()
    limits: dict[str, str] = {}
    if spec.cpu:
        limits["cpu"] = f"{max(1, math.ceil(round(spec.cpu * 1000, 6)))}m"
    if spec.memory_bytes:
        limits["memory"] = str(spec.memory_bytes)
    volumes: list[dict[str, Any]] = [{"name": AGENT_VOLUME, "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": AGENT_VOLUME, "mountPath": AGENT_MOUNT, "readOnly": True}]
    for number, (path, size) in enumerate(sorted(spec.tmpfs.items())):
        volumes.append({"name": f"tmpfs-{number}", "emptyDir": {"medium": "Memory", "sizeLimit": str(size)}})
        mounts.append({"name": f"tmpfs-{number}", "mountPath": path})
    if spec.tools:
        if tools is None:
            raise ConfigError("a sandbox with tools needs the tools bundle: build it (`orchard image build-tools`)")
        volumes.append({"name": TOOLS_VOLUME, "emptyDir": {}})
        mounts.append({"name": TOOLS_VOLUME, "mountPath": TOOLS_MOUNT, "readOnly": True})
    main_limits = dict(limits)
    if spec.disk_bytes:
        allowance = _bundle_allowance(bundle.path) + (_tools_allowance(tools.size()) if spec.tools and tools else 0)
        main_limits["ephemeral-storage"] = str(spec.disk_bytes + allowance)
    init = {
        "name": INIT_CONTAINER,
        "image": config.agent_image,
        "command": INJECT_COMMAND,
        "volumeMounts": [{"name": AGENT_VOLUME, "mountPath": AGENT_MOUNT}],
        "resources": _resources(limits),
        "securityContext": _security_context(),
    }
    inits = [init]
    if spec.tools:
        inits.append(
            {
                "name": TOOLS_CONTAINER,
                "image": config.tools_image,
                "command": INJECT_TOOLS,
                "volumeMounts": [{"name": TOOLS_VOLUME, "mountPath": TOOLS_MOUNT}],
                "resources": _resources(limits),
                "securityContext": _security_context(),
            }
        )
    command = [*bundle.command(AGENT_MOUNT), "--workdir", spec.workdir]
    listen = ["--pod", f"$({POD_IP_ENV}):{AGENT_PORT}"]  # expanded by the kubelet: the Pod IP
    pod_ip = {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    main = {
        "name": MAIN_CONTAINER,
        "image": spec.image,
        "command": [_literal(part) for part in command] + listen,
        "env": [pod_ip, *({"name": k, "value": _literal(v)} for k, v in environment.items())],
        "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": AGENT_PORT}, "periodSeconds": 1},
        "volumeMounts": mounts,
        "resources": _resources(main_limits),
        "securityContext": _security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "shareProcessNamespace": True,
        "terminationGracePeriodSeconds": 1,
        "initContainers": inits,
        "containers": [main],
        "volumes": volumes,
    }
    if config.runtime_class:
        pod_spec["runtimeClassName"] = config.runtime_class
    if config.node_selector:
        pod_spec["nodeSelector"] = dict(config.node_selector)
    if config.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in config.tolerations]
    if config.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in config.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(sandbox_id),
            "namespace": config.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def _security_context() -> dict[str, Any]:
    """Every container's: no privilege escalation, no capabilities, the runtime's default seccomp profile."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _resources(limits: dict[str, str]) -> dict[str, Any]:
    """Requests equal to the limits (nothing asked: nothing set)."""
    return {"requests": dict(limits), "limits": dict(limits)} if limits else {}


def _literal(text: str) -> str:
    """`text` as Kubernetes passes it on: it expands `$(VAR)` in a container's command and env, and `$$` is `$`."""
    return text.replace("$", "$$")


@lru_cache(maxsize=8)
def _bundle_allowance(path: Path) -> int:
    """Bytes the injected bundle at `path` takes in a Pod's storage (whole MiB, one spare), added to a disk cap."""
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return (math.ceil(size / _MIB) + 1) * _MIB


def _tools_allowance(size: int) -> int:
    """Bytes the injected tools bundle of `size` bytes takes in a Pod's storage (whole MiB, one spare)."""
    return (math.ceil(size / _MIB) + 1) * _MIB


# -- reading Pods ----------------------------------------------------------------------


def pod_state(pod: dict, *, unschedulable_grace: float = 0.0) -> SandboxState:
    """What a sandbox's Pod says: running with the agent's address, starting, failed (why) or going.

    `unschedulable_grace` is how many seconds an unschedulable Pod still has before that is a failure.
    """
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return SandboxState(running=False, exists=False, message="the Pod is being deleted")
    failure = _failure(pod)
    if failure is None:
        unschedulable = _unschedulable(pod)
        if unschedulable is not None and unschedulable_grace <= 0:
            failure = f"the Pod cannot be scheduled: {unschedulable}"
    if failure is not None:
        return SandboxState(running=False, message=failure)
    main = _container_status(status.get("containerStatuses"), MAIN_CONTAINER)
    ip = status.get("podIP")
    if status.get("phase") == "Running" and ip and main.get("ready"):
        host = f"[{ip}]" if ":" in ip else ip
        return SandboxState(running=True, address=f"http://{host}:{AGENT_PORT}")
    return SandboxState(running=False, starting=True, message=_progress(pod))


def _failure(pod: dict) -> str | None:
    """Why the Pod will never serve, or None while it may."""
    status = pod.get("status") or {}
    if status.get("reason") == "Evicted":
        return f"the Pod was evicted: {status.get('message') or 'no reason given'}"
    for container in status.get("initContainerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated")
        if ended and ended.get("exitCode") != 0:
            return f"the agent's injector (init container {container.get('name')}) failed: {_ended(ended)}"
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAILED_WAITING:
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return f"{waiting['reason']} for container {container.get('name')} (image {container.get('image')}){detail}"
    main = _container_status(status.get("containerStatuses"), MAIN_CONTAINER)
    ended = (main.get("state") or {}).get("terminated")
    if ended:
        return f"the container exited: {_ended(ended)}"
    if status.get("phase") in ("Failed", "Succeeded"):
        why = ": ".join(part for part in (status.get("reason"), status.get("message")) if part)
        return f"the Pod {'failed' if status['phase'] == 'Failed' else 'ended'}" + (f": {why}" if why else "")
    return None


def _unschedulable(pod: dict) -> str | None:
    """The scheduler's message when it marked the Pod unschedulable, else None."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status"), condition.get("reason")) == UNSCHEDULABLE:
            return condition.get("message") or "no node fits it"
    return None


def _ended(terminated: dict) -> str:
    """`OOMKilled (exit code 137): <last log lines>`, from a container's terminated state."""
    text = f"{terminated.get('reason') or 'terminated'} (exit code {terminated.get('exitCode')})"
    if terminated.get("reason") == "OOMKilled":
        text += ": out of memory"
    message = (terminated.get("message") or "").strip()
    return f"{text}: {message[-1000:]}" if message else text


def _progress(pod: dict) -> str:
    """What a starting Pod is waiting for, in a few words."""
    status = pod.get("status") or {}
    if not (pod.get("spec") or {}).get("nodeName"):
        return "the Pod waits to be scheduled"
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return f"container {container.get('name')} is waiting: {waiting.get('reason') or 'starting'}"
    if status.get("phase") == "Running":
        return "the agent is starting (its container is not ready yet)"
    return f"the Pod is {str(status.get('phase') or 'Pending').lower()}"


def _container_status(statuses: list[dict] | None, name: str) -> dict:
    return next((c for c in statuses or [] if c.get("name") == name), {})


def _is_sandbox(pod: dict, sandbox_id: str, owner: str | None = None) -> bool:
    """Whether Orchard labelled `pod` as sandbox `sandbox_id` (of `owner`, if given)."""
    labels = pod["metadata"].get("labels") or {}
    return (
        labels.get(MANAGED_BY) == "orchard"
        and labels.get(ID_LABEL) == sandbox_id
        and (owner is None or _annotations(pod).get(OWNER_ANNOTATION) == owner)
    )


def _annotations(pod: dict) -> dict[str, str]:
    return dict(pod["metadata"].get("annotations") or {})


def _sandbox_labels(pod: dict) -> dict[str, str]:
    """The Pod's labels and annotations in the Docker backend's label names (see `labels_for`)."""
    labels, notes = pod["metadata"].get("labels") or {}, _annotations(pod)
    found = {
        "managed": "true",
        "sandbox": labels.get(ID_LABEL, ""),
        "owner": notes.get(OWNER_ANNOTATION, ""),
        "created": notes.get(CREATED_ANNOTATION, ""),
        "ttl": notes.get(TTL_ANNOTATION, ""),
        "network": labels.get(NETWORK_LABEL, ""),
    }
    if notes.get(RUN_KEY) or labels.get(RUN_KEY):
        found["run"] = notes.get(RUN_KEY) or labels[RUN_KEY]
    if notes.get(LEASE_ANNOTATION):
        found["lease"] = notes[LEASE_ANNOTATION]
    return {LABEL_PREFIX + key: value for key, value in found.items()}


def _version(pod: dict) -> int | None:
    return _version_number((pod.get("metadata") or {}).get("resourceVersion", ""))


def _version_number(text: str) -> int | None:
    """A resourceVersion as the integer etcd makes it; None if it is not one (then it is not compared)."""
    return int(text) if text.isdigit() else None


# -- talking to the API server ---------------------------------------------------------


def _api_client(config: KubernetesConfig) -> ApiClient:
    """An API client for the config's cluster: the Pod's service account inside one, else a kubeconfig."""
    import os

    from kubernetes import client
    from kubernetes import config as kube_config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if config.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            path = str(config.kubeconfig.expanduser()) if config.kubeconfig else None
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"the kubeconfig file {path} does not exist; set the backend's kubeconfig")
            kube_config.load_kube_config(
                config_file=path, context=config.context, client_configuration=configuration, persist_config=False
            )
    except ConfigException as exc:
        where = config.kubeconfig or "$KUBECONFIG or ~/.kube/config"
        raise ConfigError(f"no usable Kubernetes configuration ({where}): {exc}") from None
    configuration.retries = False  # Orchard retries itself, with backoff and a deadline
    configuration.connection_pool_maxsize = config.api_concurrency + 2  # and the watch
    api = client.ApiClient(configuration)
    api.user_agent = f"orchard/{__version__}"
    return api


def _refusal(status: int, reason: str | None, data: bytes | None, attempts: int) -> ApiRefused:
    """An ApiRefused from an error answer (a Kubernetes Status object, or whatever came)."""
    message = ""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        message = str(json.loads(data or b"{}").get("message") or "")
    if not message and data:
        message = data[:300].decode(errors="replace").strip()
    return ApiRefused(status, reason or "", message, attempts)


def _auth_error(exc: ApiRefused, doing: str) -> AuthError:
    if exc.status == 401:
        return AuthError(f"the Kubernetes API server refused Orchard's credentials ({exc}); check the kubeconfig")
    return AuthError(
        f"Orchard may not {doing} ({exc}); grant it the Role of deploy/kubernetes/ (pods: create, get, list, "
        "watch, delete)"
    )


def _seconds(text: str | None) -> float | None:
    """A `Retry-After` header's seconds (its date form is not used by the API server)."""
    with contextlib.suppress(TypeError, ValueError):
        return max(0.0, float(text))  # type: ignore[arg-type]
    return None


def _lines(response: Any) -> Iterator[bytes]:
    """The lines of a streamed answer (one watch event each), as they arrive."""
    pending = b""
    for chunk in response.stream(1 << 16):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending

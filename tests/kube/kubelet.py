"""A test kubelet: the one node of a real kube-apiserver, running its Pods as Docker containers here.

The API server of tests/kube/conftest.py has no scheduler, no controllers and no kubelet: a Pod
created there stays Pending forever. `TestKubelet` plays the missing parts for one node, against
the real API server (plain JSON over the given `ApiClient`'s connection pool, TLS and token):

    with TestKubelet(kube.client(), docker_client, namespace="demo") as kubelet:
        ...  # create Pods: they are bound, run, reported Ready at podIP 127.0.0.N, deleted

What it emulates:
* **A node.** It registers a Node (`orchard-test-node`, Ready, capacity and allocatable from this
  host, labels `kubernetes.io/hostname|os|arch` plus `labels=`) and deletes it at `stop()`.
* **The scheduler, for one node.** LIST+WATCH of the Pods (one namespace or all; resumed from the
  last resourceVersion, relisted on 410 Gone, reconnected with backoff when the API server
  restarts); a Pod with no `spec.nodeName` (and the default scheduler) is bound to the node with a
  Binding. A Pod whose `nodeSelector` the node's labels do not satisfy stays Pending with condition
  PodScheduled=False, reason Unschedulable, as the real scheduler leaves it.
* **The kubelet** ("containers" mode). Each bound Pod gets its own loopback address 127.0.0.N (N from
  2 up, never two Pods at once, across processes too: a lock file per address; 127.0.0.0/8 all
  routes to `lo` on Linux): that is its podIP. Each `emptyDir` is a fresh Docker volume (empty, mode
  0777; a tmpfs for `medium: Memory`, `sizeLimit` as its size); a `hostPath` is a bind mount of that
  host path, its `type` checked (Directory, DirectoryOrCreate, File, Socket, or none). The init
  containers run one by one to completion, then the main containers start; each is a `docker run`
  of the image with command/args (Kubernetes semantics: `command` replaces the ENTRYPOINT and drops
  the image's CMD, `$(VAR)` expanded), env (values, the common `fieldRef`s, and `secretKeyRef`s read
  from the API server), workingDir and volumeMounts (readOnly too). Every containerPort, and every
  tcpSocket and httpGet probe's port, is published on 127.0.0.N at the same port. securityContext
  maps to Docker where Docker can: capabilities add/drop,
  `allowPrivilegeEscalation: false` (no-new-privileges), readOnlyRootFilesystem, privileged,
  runAsUser/runAsGroup/supplementalGroups, runAsNonRoot (checked against the image's user),
  seccomp RuntimeDefault (Docker's profile; none given is Unconfined, as a 1.20 kubelet runs it).
  Limits: cpu -> nano_cpus, memory -> mem_limit (no swap); requests.cpu -> cpu shares.
  `runtimeClassName` -> the Docker runtime named by its RuntimeClass's handler.
  restartPolicy Never: a main container that exits makes the Pod Failed (non-zero) or Succeeded
  (all zero); Always/OnFailure: Docker's restart policy of the same name restarts it (restartCount).
  `hostNetwork: true`: the containers run in this host's network namespace (Docker's `host`
  network), the podIP is the hostIP 127.0.0.1 and nothing is published; such a Pod reaches what
  the host reaches on loopback (the API server, other Pods at 127.0.0.N) and its ports are the host's.
* **Service accounts.** A Pod that names a serviceAccountName (where neither it nor the account
  sets automountServiceAccountToken: false) gets what the ServiceAccount admission plugin and a
  kubelet give it together: a token of that account bound to the Pod (TokenRequest, 3607 s), the
  API server's CA and the namespace, read-only at /var/run/secrets/kubernetes.io/serviceaccount in
  every container that mounts nothing there. Every container gets the `kubernetes` Service's
  variables (KUBERNETES_SERVICE_HOST/PORT/PORT_HTTPS, KUBERNETES_PORT), which here name the API
  server's own loopback address and port (`service_variables`). A Secret, key, service account or
  hostPath the Pod names that is not there is CreateContainerConfigError, and is looked for again
  with backoff (1 s doubling to 10 s), so a Pod starts once it is created.
* **Statuses**, written with the status subresource as a kubelet writes them: phase, podIP/podIPs,
  hostIP, startTime, conditions (PodScheduled, Initialized, ContainersReady, Ready) and init and
  main containerStatuses (image, imageID, containerID, state waiting/running/terminated with
  exitCode and reason: OOMKilled when Docker says so, else Completed or Error; restartCount,
  ready, started). An image the local Docker engine lacks is ErrImagePull with a message (an
  invalid name InvalidImageName); the Pod stays Pending and the image is looked for again with
  backoff (2 s doubling to 60 s, not a tight loop), so a Pod starts once the image is there.
* **Probes, tcpSocket and httpGet** (startup, readiness, liveness; delay, period, timeout,
  thresholds). tcpSocket: a connection to 127.0.0.N:port that stays open. (Docker's userland proxy
  accepts every connection on a published port and closes it at once when nothing listens in the
  container, so a bare connect would always pass.) httpGet: a GET of the path (with its headers;
  HTTPS unverified) answered 200 to 399, redirects not followed. A container without a
  readinessProbe is ready when running.
* **Deletion.** A Pod with a deletionTimestamp: its containers are stopped (SIGTERM, then SIGKILL
  after the grace period, at most 30 s) and removed, its volumes removed, its address released,
  then the Pod is deleted with grace 0 (uid precondition), as the kubelet ends it. A Pod deleted
  outright (grace 0): the same clean-up.
* **"status-only" mode**, no Docker at all: bound Pods are at once Running and Ready, their
  containers running, at a fake podIP 127.1.x.y (a loopback address where nothing listens; never
  a 10.x address, so a client that tries it sends nothing off this machine); deletion as above.
  This is the control plane alone, for the 1,000-sandbox benchmark.
* **Faults**: `kill(pod)` kills a Pod's main container (Docker kill: exit 137, so a Never Pod
  becomes Failed; in status-only mode the status says so); `pods_seen`, `address()`,
  `containers()`, `leftovers()`, `errors`, `stats` for tests. One Pod's failure never stops the
  loops (it lands in `errors`); `stop()` removes every container, volume and network it made
  (and those of a test kubelet whose process died).

What it does NOT emulate:
* No real scheduler: no resource fit, affinity, taints/tolerations, priorities or preemption;
  only `nodeSelector` is checked. Requests are not reserved; `pods` capacity is not enforced.
* No CNI, no Services, no DNS, no kube-proxy: NetworkPolicies are NOT enforced (ingress and egress
  are whatever Docker's bridge network allows: egress is open). Pod IPs are loopback addresses:
  reachable from this host and from hostNetwork Pods, not from inside other Pods; the API server,
  which the `kubernetes` Service's variables name, likewise. Init containers run in a network
  namespace of their own; the first main container owns the Pod's published ports and later main
  containers join its network namespace. hostPID/hostIPC are refused.
* No cgroups beyond what Docker gives: no QoS classes, no eviction, no ephemeral-storage limits,
  no pids limit; OOMKilled is Docker's own report.
* Probes: exec and grpc probes are refused with CreateContainerConfigError; lifecycle hooks
  (postStart, preStop) are ignored.
* Volumes: emptyDir and hostPath only (no configMap, secret, projected, downwardAPI, PVC; no
  subPath); env: no configMapKeyRef, resourceFieldRef or envFrom (all refused with
  CreateContainerConfigError); no service-link variables. No service-account token for a Pod that
  names no account (this API server runs without the ServiceAccount admission plugin, which would
  name `default`), and a projected token is never refreshed.
* Images are never pulled (imagePullPolicy and imagePullSecrets are ignored; a local image runs).
* No kubelet API: no logs, exec, attach or port-forward through the API server; no Events, no
  node heartbeats or Leases, no activeDeadlineSeconds, no in-place container updates, no
  CrashLoopBackOff timing (Docker restarts at its own pace), no AppArmor/SELinux/sysctls/fsGroup.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import heapq
import http.client
import itertools
import json
import logging
import os
import platform
import queue
import re
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlencode, urlsplit

import urllib3

log = logging.getLogger("orchard.tests.kubelet")

Obj = dict[str, Any]
Mode = Literal["containers", "status-only"]

LABEL = "orchard.test-kubelet"
HOST_IP = "127.0.0.1"
DEFAULT_SCHEDULER = "default-scheduler"
FINAL_PHASES = {"Succeeded", "Failed"}
MERGE_PATCH = "application/merge-patch+json"
STOP_GRACE_MAX = 30  # seconds: a Pod's terminationGracePeriodSeconds, capped so a test never waits longer
IMAGE_BACKOFF = (2.0, 60.0)  # first and longest wait before looking for a missing image again
PROBE_HOLD = 0.1  # seconds a probe connection must stay open to count (see the module docstring)
ADDRESS_LOCKS = Path(tempfile.gettempdir()) / "orchard-test-kubelet-addresses"
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_SECONDS = 3607  # what a kubelet asks a projected token to live for
REFERENCE_BACKOFF = (1.0, 10.0)  # first and longest wait before looking for a missing Secret or service account again
HOST_PATH_KINDS = {"": None, "Directory": "dir", "DirectoryOrCreate": "dir", "File": "file", "Socket": "socket"}


def _now() -> str:
    """The time as Kubernetes writes it (RFC 3339, seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _docker_time(text: str | None) -> str | None:
    """Docker's nanosecond RFC 3339 time as Kubernetes writes it; None for Docker's zero time."""
    if not text or text.startswith("0001-"):
        return None
    return text[:19] + "Z"


def _dig(obj: Any, *keys: str, default: Any = None) -> Any:
    """obj[k1][k2]... or `default` where a level is missing or null."""
    for key in keys:
        if not isinstance(obj, dict) or obj.get(key) is None:
            return default
        obj = obj[key]
    return obj


def _pod_key(pod: Obj) -> tuple[str, str]:
    return pod["metadata"]["namespace"], pod["metadata"]["name"]


class ApiError(Exception):
    """The API server answered with an error status (`status`, its `reason` and `message`)."""

    def __init__(self, status: int, body: bytes) -> None:
        try:
            answer = json.loads(body)
        except ValueError:
            answer = {}
        self.status = status
        self.reason = answer.get("reason", "") if isinstance(answer, dict) else ""
        self.message = answer.get("message", body[:300].decode(errors="replace")) if isinstance(answer, dict) else ""
        super().__init__(f"{status} {self.reason}: {self.message}")


class _Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone): relist."""


class _Leave(Exception):
    """A Pod runner stops running its Pod (deleted, gone, or the kubelet stops)."""


class _Unsupported(Exception):
    """A Pod asks for something this test kubelet does not emulate (CreateContainerConfigError)."""


class _Missing(Exception):
    """Something the Pod names is not there yet (a Secret, its key, a service account, a hostPath):
    CreateContainerConfigError, looked for again with backoff, as a kubelet does."""


class _Api:
    """JSON over the `ApiClient`'s own urllib3 pool, host, TLS settings and token; no model classes.

    The generated models are slow and drop what they do not know; the kubelet reads and writes
    objects as the API server sends them. Calls are retried with backoff on connection errors, 429
    and 5xx for up to `retry_for` seconds (an API server restarting), never on other errors.
    """

    RETRIED = frozenset({429, 500, 502, 503, 504})

    def __init__(self, api_client: Any) -> None:
        self._client = api_client
        self._pool = api_client.rest_client.pool_manager
        self._host = api_client.configuration.host.rstrip("/")

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "orchard-test-kubelet"}
        auth = self._client.configuration.auth_settings().get("BearerToken")
        if auth:
            headers[auth["key"]] = auth["value"]
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def open(
        self,
        method: str,
        path: str,
        *,
        query: dict | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
        stream: bool = False,
    ):
        """One request, not retried; raises ApiError for a non-2xx answer; a streaming response if `stream`."""
        url = self._host + path + ("?" + urlencode(query) if query else "")
        response = self._pool.request(
            method,
            url,
            body=None if body is None else json.dumps(body).encode(),
            headers=self._headers(content_type if body is not None else None),
            timeout=urllib3.Timeout(connect=5.0, read=timeout),
            retries=False,
            preload_content=not stream,
        )
        if not 200 <= response.status < 300:
            data = response.read() if stream else response.data
            response.release_conn()
            raise ApiError(response.status, data)
        return response

    def exists(self, path: str) -> bool:
        """Whether the object at `path` exists (GET; 404: no)."""
        try:
            self.call("GET", path, answer=False)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def call(self, method: str, path: str, *, retry_for: float = 10.0, answer: bool = True, **kwargs: Any) -> Any:
        """The JSON answer of one call (None without `answer`: not parsed), retried as the class says."""
        deadline = time.monotonic() + retry_for
        delay = 0.05
        while True:
            try:
                data = self.open(method, path, **kwargs).data
                return json.loads(data) if data and answer else None
            except ApiError as exc:
                if exc.status not in self.RETRIED:
                    raise
                error: Exception = exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                error = exc
            if time.monotonic() + delay > deadline:
                raise error
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    """The API path of a Pod (or of its `sub`resource)."""
    path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
    return f"{path}/{sub}" if sub else path


class _WorkQueue:
    """Keys to reconcile: each queued at most once, never handled by two threads at once, and
    re-queued if it changed while being handled (client-go's workqueue, small), with delayed adds."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._order: deque[str] = deque()
        self._dirty: set[str] = set()
        self._busy: set[str] = set()
        self._later: list[tuple[float, int, str]] = []
        self._tiebreak = itertools.count()
        self._closed = False

    def add(self, key: str) -> None:
        with self._cond:
            self._add(key)

    def _add(self, key: str) -> None:
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._busy:
            self._order.append(key)
            self._cond.notify()

    def add_after(self, key: str, delay: float) -> None:
        with self._cond:
            heapq.heappush(self._later, (time.monotonic() + delay, next(self._tiebreak), key))
            self._cond.notify()

    def get(self) -> str | None:
        """The next key to handle (call done() after), or None once closed."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._later and self._later[0][0] <= now:
                    self._add(heapq.heappop(self._later)[2])
                if self._order:
                    key = self._order.popleft()
                    self._dirty.discard(key)
                    self._busy.add(key)
                    return key
                self._cond.wait(self._later[0][0] - now if self._later else None)
            return None

    def done(self, key: str) -> None:
        with self._cond:
            self._busy.discard(key)
            if key in self._dirty:
                self._order.append(key)
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _Loopback:
    """Pod addresses 127.0.0.N (then 127.0.1.N, ...), N from 2 up, one Pod each while in use.

    Each address is held with a lock file (flock, released when this process dies), so two test
    kubelets on one machine (pytest-xdist workers) never hand out the same one; an address where
    one of the Pod's ports is already taken is skipped.
    """

    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, ports: list[tuple[int, str]]) -> str:
        ADDRESS_LOCKS.mkdir(parents=True, exist_ok=True)
        busy = 0
        with self._lock:
            for index in range(2, 256 * 256):
                address = f"127.0.{index // 256}.{index % 256}"
                if index % 256 in (0, 255) or address in self._held:
                    continue
                fd = os.open(ADDRESS_LOCKS / address, os.O_CREAT | os.O_RDWR, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                if all(_port_free(address, port, protocol) for port, protocol in ports):
                    self._held[address] = fd
                    return address
                os.close(fd)
                busy += 1
                if busy == 50:  # not one Pod's leftover: something listens on the port on every address
                    raise RuntimeError(
                        f"test kubelet: ports {ports} are taken on 50 loopback addresses in a row: "
                        "does a process listen on 0.0.0.0 at one of them?"
                    )
        raise RuntimeError("test kubelet: no free loopback address left")

    def release(self, address: str | None) -> None:
        with self._lock:
            fd = self._held.pop(address, None) if address else None
        if fd is not None:
            os.close(fd)

    def release_all(self) -> None:
        with self._lock:
            held, self._held = self._held, {}
        for fd in held.values():
            os.close(fd)


def _port_free(address: str, port: int, protocol: str) -> bool:
    kind = socket.SOCK_DGRAM if protocol == "udp" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as docker-proxy binds
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


class _FakeAddresses:
    """status-only Pod IPs: 127.1.x.y, loopback addresses where nothing listens, reused once freed."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 1
        self._lock = threading.Lock()

    def acquire(self) -> str:
        with self._lock:
            if self._free:
                index = heapq.heappop(self._free)
            else:
                index, self._next = self._next, self._next + 1
        return f"127.1.{index // 254 % 256}.{index % 254 + 1}"

    def release(self, address: str | None) -> None:
        if address:
            _, _, high, low = (int(part) for part in address.split("."))
            with self._lock:
                heapq.heappush(self._free, high * 254 + low - 1)


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined variable is replaced, `$$` is a literal `$`."""

    def replace(match: re.Match) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, text)


def _cpu_cores(quantity: Any) -> float | None:
    from orchard.env.backends.base import parse_cpu

    try:
        return parse_cpu(str(quantity))
    except Exception:  # zero, or not a quantity: no limit (the API server validated it already)
        return None


def _memory_bytes(quantity: Any) -> int | None:
    from orchard.env.backends.base import parse_memory

    try:
        return parse_memory(str(quantity))
    except Exception:
        return None


@dataclass
class _Probe:
    """One tcpSocket or httpGet probe of a running container, with its counters."""

    kind: Literal["startup", "readiness", "liveness"]
    spec: Obj
    port: int
    host: str
    due: float
    successes: int = 0
    failures: int = 0

    def setting(self, name: str, default: int) -> int:
        return int(self.spec.get(name) or default)

    def check(self) -> bool:
        """An HTTP answer from 200 to 399 for httpGet; for tcpSocket a connection to host:port that
        the far side keeps open (see the module docstring)."""
        timeout = self.setting("timeoutSeconds", 1)
        if "httpGet" in self.spec:
            return self._http_check(self.spec["httpGet"], timeout)
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as connection:
                connection.settimeout(PROBE_HOLD)
                try:
                    return connection.recv(1) != b""
                except TimeoutError:
                    return True
        except OSError:
            return False

    def _http_check(self, get: Obj, timeout: int) -> bool:
        """A GET of the probe's path, as the kubelet's prober sends it (HTTPS unverified, redirects not followed)."""
        if (get.get("scheme") or "HTTP").upper() == "HTTPS":
            unverified = ssl.create_default_context()
            unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=unverified
            )
        else:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        headers = {"User-Agent": "kube-probe/1.20", "Accept": "*/*"}
        headers |= {header["name"]: header["value"] for header in get.get("httpHeaders") or []}
        try:
            connection.request("GET", get.get("path") or "/", headers=headers)
            return 200 <= connection.getresponse().status < 400
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()


@dataclass
class _Box:
    """One container of a Pod: its spec, its Docker container, and the status the kubelet reports."""

    spec: Obj
    init: bool
    docker_id: str | None = None
    image_id: str = ""
    state: Obj = field(default_factory=dict)
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    restarts: int = 0
    probes: list[_Probe] = field(default_factory=list)
    oom: bool = False  # Docker said "oom" since the last "die"
    died: Obj = field(default_factory=dict)  # the last "die" event, as a terminated state

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def exit_code(self) -> int | None:
        return _dig(self.state, "terminated", "exitCode")

    def status(self) -> Obj:
        answer = {
            "name": self.name,
            "state": self.state,
            "lastState": self.last_state,
            "ready": self.ready,
            "restartCount": self.restarts,
            "image": self.spec.get("image", ""),
            "imageID": self.image_id,
            "started": self.started,
        }
        if self.docker_id:
            answer["containerID"] = f"docker://{self.docker_id}"
        return answer


class _PodRunner(threading.Thread):
    """Runs one bound Pod with Docker in its own thread, from init containers to clean-up.

    Everything that happens to the Pod arrives in its inbox: the Pod as the watch last saw it,
    Docker events of its containers, `gone` (deleted from the API server) and `stop`. Blocking
    work (starting, waiting for an init container, backoff) pumps the inbox, so a deletion
    interrupts it (as `_Leave`); the status is written whenever it changed, and again after a
    failed write (an API server restarting) until it is written.
    """

    def __init__(self, kubelet: TestKubelet, pod: Obj) -> None:
        super().__init__(name=f"test-kubelet pod {pod['metadata']['name']}", daemon=True)
        self.kubelet = kubelet
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.namespace, self.pod_name = _pod_key(pod)
        spec = pod["spec"]
        self.restart_policy = spec.get("restartPolicy") or "Always"
        self.init_boxes = [
            _Box(c, init=True, state={"waiting": {"reason": "PodInitializing"}})
            for c in spec.get("initContainers") or []
        ]
        creating = "PodInitializing" if self.init_boxes else "ContainerCreating"
        self.main_boxes = [_Box(c, init=False, state={"waiting": {"reason": creating}}) for c in spec["containers"]]
        self.address: str | None = None
        self.start_time = _now()
        self.volumes: dict[str, str] = {}  # Pod volume name -> Docker volume name
        self.host_paths: dict[str, str] = {}  # Pod volume name -> the host folder or file it binds
        self.host_network = bool(pod["spec"].get("hostNetwork"))
        self.service_account: Path | None = None  # the host folder of its projected token, ca.crt and namespace
        self.env: dict[str, dict[str, str]] = {}  # container name -> its environment, Secrets read
        self.inbox: queue.Queue[tuple] = queue.Queue()
        self.leave: str | None = None  # "delete" | "gone" | "stop"
        self.grace = STOP_GRACE_MAX
        self._transitions: dict[str, tuple[str, str]] = {}
        self._written: Obj | None = None
        self._failed_write = False
        self._last_news = time.monotonic()

    # -- the inbox ----------------------------------------------------------------------------

    def post(self, message: tuple) -> None:
        self.inbox.put(message)

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "pod":
            self.pod = message[1]
            if self.pod["metadata"].get("deletionTimestamp") and self.leave is None:
                self.leave = "delete"
                self.grace = min(int(self.pod["metadata"].get("deletionGracePeriodSeconds") or 0), STOP_GRACE_MAX)
        elif kind in ("gone", "stop"):
            if self.leave != "gone":
                self.leave = kind
        elif kind == "docker":
            self._docker_event(*message[1:])

    def _pump(self, seconds: float) -> None:
        """Handle the inbox and write the status for up to `seconds`, less if a container changed;
        raises _Leave when the Pod ends here."""
        deadline = time.monotonic() + seconds
        while True:
            self._flush()
            if self.leave:
                raise _Leave
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                message = self.inbox.get(timeout=min(remaining, 0.5) if self._failed_write else remaining)
            except queue.Empty:
                continue
            self._handle(message)
            if message[0] == "docker":
                self._flush()
                return

    def _sleep(self, seconds: float) -> None:
        """Pump the inbox for all of `seconds` (a backoff)."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self._pump(remaining)

    # -- the lifecycle ------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run_pod()
        except _Leave:
            pass
        except Exception as exc:  # one Pod's failure never stops the kubelet: the Pod says why, and waits
            reason = "CreateContainerConfigError" if isinstance(exc, _Unsupported) else "CreateContainerError"
            if not isinstance(exc, _Unsupported):
                self.kubelet._error(f"pod {self.namespace}/{self.pod_name}", exc)
            for box in self.init_boxes + self.main_boxes:
                if "waiting" in box.state or not box.state:
                    box.state = {"waiting": {"reason": reason, "message": str(exc)}}
            with contextlib.suppress(_Leave):
                self._idle()
        finally:
            self._teardown()

    def _run_pod(self) -> None:
        self.address = HOST_IP if self.host_network else self.kubelet._loopback.acquire(self._published_ports())
        self._check_supported()
        runtime = self._runtime()
        self._await_references()
        self._create_volumes()
        for box in self.init_boxes:
            self._run_init(box, runtime)
        self._start_main(runtime)
        self._idle()

    def _idle(self) -> None:
        """Serve probes and events until the Pod leaves (raises _Leave, and nothing else)."""
        while True:
            try:
                probes = [(probe, box) for box in self.main_boxes for probe in box.probes if "running" in box.state]
                for probe, box in probes:
                    if probe.due <= time.monotonic():
                        self._probe(box, probe)
                if time.monotonic() - self._last_news > 10:  # a missed Docker event cannot leave a state stale
                    self._refresh()
            except Exception as exc:
                self.kubelet._error(f"pod {self.namespace}/{self.pod_name}", exc)
                self._sleep(1.0)
            next_due = min(
                [probe.due for box in self.main_boxes for probe in box.probes if "running" in box.state],
                default=float("inf"),
            )
            self._pump(max(0.0, min(next_due, time.monotonic() + 10) - time.monotonic()))

    def _teardown(self) -> None:
        docker = self.kubelet._docker
        boxes = [box for box in self.main_boxes + self.init_boxes if box.docker_id]
        if self.leave == "delete" and self.grace:
            for box in boxes:
                if "running" in box.state:
                    with contextlib.suppress(Exception):
                        docker.containers.get(box.docker_id).stop(timeout=self.grace)
        for box in boxes:
            with contextlib.suppress(Exception):
                docker.api.remove_container(box.docker_id, force=True)
            self.kubelet._forget_container(box.docker_id)
        for volume in self.volumes.values():
            with contextlib.suppress(Exception):
                docker.api.remove_volume(volume, force=True)
        if self.service_account is not None:
            shutil.rmtree(self.service_account, ignore_errors=True)
        if not self.host_network:
            self.kubelet._loopback.release(self.address)
        self.kubelet._runner_done(self)
        if self.leave == "delete":
            self.kubelet._delete_pod(self.namespace, self.pod_name, self.uid)

    # -- containers ---------------------------------------------------------------------------

    def _published_ports(self) -> list[tuple[int, str]]:
        """(port, protocol) of every containerPort and every tcpSocket probe port of the main containers."""
        ports: dict[tuple[int, str], None] = {}
        for box in self.main_boxes:
            named = {}
            for port in box.spec.get("ports") or []:
                protocol = (port.get("protocol") or "TCP").lower()
                ports[(int(port["containerPort"]), protocol)] = None
                if port.get("name"):
                    named[port["name"]] = int(port["containerPort"])
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                target = _dig(box.spec, kind, "tcpSocket", "port", default=_dig(box.spec, kind, "httpGet", "port"))
                if target is not None:
                    number = named.get(target) if isinstance(target, str) and not target.isdigit() else int(target)
                    if number:
                        ports[(number, "tcp")] = None
        return list(ports)

    def _check_supported(self) -> None:
        spec = self.pod["spec"]
        for flag in ("hostPID", "hostIPC"):
            if spec.get(flag):
                raise _Unsupported(f"test kubelet: {flag} is not emulated")
        if _dig(spec, "securityContext", "seccompProfile", "type") == "Localhost":
            raise _Unsupported("test kubelet: a Localhost seccomp profile is not emulated")
        volumes = {}
        for volume in spec.get("volumes") or []:
            kinds = [key for key in volume if key != "name"]
            if kinds not in (["emptyDir"], ["hostPath"]):
                raise _Unsupported(
                    f"test kubelet: volume {volume['name']!r}: only emptyDir and hostPath volumes are emulated, not {kinds}"
                )
            if kinds == ["hostPath"] and (volume["hostPath"].get("type") or "") not in HOST_PATH_KINDS:
                raise _Unsupported(
                    f"test kubelet: volume {volume['name']!r}: hostPath type {volume['hostPath']['type']!r}"
                )
            volumes[volume["name"]] = volume
        for box in self.init_boxes + self.main_boxes:
            container = box.spec
            for mount in container.get("volumeMounts") or []:
                if mount.get("subPath") or mount.get("subPathExpr"):
                    raise _Unsupported(f"test kubelet: container {box.name!r}: subPath mounts are not emulated")
            if container.get("envFrom"):
                raise _Unsupported(f"test kubelet: container {box.name!r}: envFrom is not emulated")
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = container.get(kind)
                if probe and not (probe.get("tcpSocket") or probe.get("httpGet")):
                    raise _Unsupported(
                        f"test kubelet: container {box.name!r}: only tcpSocket and httpGet probes are emulated ({kind})"
                    )
            if _dig(container, "securityContext", "seccompProfile", "type") == "Localhost":
                raise _Unsupported(f"test kubelet: container {box.name!r}: a Localhost seccomp profile is not emulated")
            for item in container.get("env") or []:
                source = item.get("valueFrom")
                if source is not None and not (_dig(source, "fieldRef", "fieldPath") or source.get("secretKeyRef")):
                    raise _Unsupported(
                        f"test kubelet: env {item['name']!r}: only fieldRef and secretKeyRef sources are emulated, "
                        f"not {list(source)}"
                    )

    def _runtime(self) -> str | None:
        """The Docker runtime of the Pod's runtimeClassName (its RuntimeClass's handler), or None."""
        name = self.pod["spec"].get("runtimeClassName")
        if not name:
            return None
        try:
            handler = self.kubelet._api.call("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{quote(name)}")["handler"]
        except ApiError as exc:
            raise _Unsupported(f"test kubelet: RuntimeClass {name!r}: {exc.message}") from None
        if handler not in (self.kubelet._docker.info().get("Runtimes") or {}):
            raise _Unsupported(f"test kubelet: RuntimeClass {name!r}: Docker has no runtime {handler!r}")
        return handler

    def _await_references(self) -> None:
        """Read what the Pod names elsewhere: each container's Secrets, its hostPaths, its service
        account's token. Until all are there the containers wait in CreateContainerConfigError and
        they are looked for again with backoff, as a kubelet keeps trying."""
        delay = REFERENCE_BACKOFF[0]
        while True:
            try:
                self.host_paths = {
                    volume["name"]: self._host_path(volume["hostPath"])
                    for volume in self.pod["spec"].get("volumes") or []
                    if "hostPath" in volume
                }
                self.env = {box.name: self._environment(box.spec) for box in self.init_boxes + self.main_boxes}
                token = self._service_account_token()
                break
            except _Missing as exc:
                for box in self.init_boxes + self.main_boxes:
                    box.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                self._sleep(delay)
                delay = min(delay * 2, REFERENCE_BACKOFF[1])
        if token is not None:
            self.service_account = self._project_token(token)

    def _host_path(self, source: Obj) -> str:
        """The host path a hostPath volume binds, checked (or made) as its `type` says."""
        path, kind = Path(source["path"]), source.get("type") or ""
        if kind == "DirectoryOrCreate":
            path.mkdir(mode=0o755, parents=True, exist_ok=True)
        wanted = HOST_PATH_KINDS[kind]
        if not path.exists():
            found = None
        else:
            found = "dir" if path.is_dir() else "socket" if path.is_socket() else "file" if path.is_file() else "other"
        if found is None or (wanted is not None and found != wanted):
            raise _Missing(f"test kubelet: hostPath type check failed: {path} is not a {kind or 'path'}")
        return str(path)

    def _service_account_token(self) -> str | None:
        """A token of the Pod's service account, bound to the Pod, from the TokenRequest API; None
        when the Pod names none or its automountServiceAccountToken (else the account's) is false."""
        spec, namespace = self.pod["spec"], self.namespace
        name = spec.get("serviceAccountName") or spec.get("serviceAccount")
        if not name or spec.get("automountServiceAccountToken") is False:
            return None
        path = f"/api/v1/namespaces/{quote(namespace)}/serviceaccounts/{quote(name)}"
        try:
            account = self.kubelet._api.call("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                raise _Missing(f'test kubelet: serviceaccount "{name}" not found') from None
            raise
        if spec.get("automountServiceAccountToken") is None and account.get("automountServiceAccountToken") is False:
            return None
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.pod_name, "uid": self.uid},
            },
        }
        return str(self.kubelet._api.call("POST", f"{path}/token", body=request)["status"]["token"])

    def _project_token(self, token: str) -> Path:
        """A host folder holding `token`, the API server's CA and the namespace, as the files of a
        service account's projected volume (readable by any user: fsGroup is not emulated)."""
        folder = Path(tempfile.mkdtemp(prefix="orchard-kubelet-token-"))
        folder.chmod(0o755)
        files = {"token": token.encode(), "ca.crt": self.kubelet._ca, "namespace": self.namespace.encode()}
        for name, data in files.items():
            (folder / name).write_bytes(data)
            (folder / name).chmod(0o644)
        return folder

    def _create_volumes(self) -> None:
        docker = self.kubelet._docker
        for volume in self.pod["spec"].get("volumes") or []:
            if "hostPath" in volume:
                continue
            name = f"k8s_{self.uid}_{volume['name']}"
            options = {}
            empty_dir = volume.get("emptyDir") or {}
            if empty_dir.get("medium") == "Memory":
                size = _memory_bytes(empty_dir["sizeLimit"]) if empty_dir.get("sizeLimit") else None
                options = {
                    "type": "tmpfs",
                    "device": "tmpfs",
                    "o": ",".join(["mode=0777", *([f"size={size}"] if size else [])]),
                }
            created = docker.volumes.create(
                name=name, driver="local", driver_opts=options, labels=self.kubelet._labels(self.pod)
            )
            self.volumes[volume["name"]] = name
            if not options:  # an emptyDir is writable by every user, as Kubernetes makes it
                with contextlib.suppress(OSError, KeyError):
                    os.chmod(created.attrs["Mountpoint"], 0o777)

    def _image(self, box: _Box) -> Any:
        """The local Docker image of a container; ErrImagePull (with backoff) until Docker has it."""
        import docker.errors

        delay = IMAGE_BACKOFF[0]
        while True:
            try:
                image = self.kubelet._docker.images.get(box.spec["image"])
                box.image_id = f"docker://{image.id}"
                return image
            except docker.errors.ImageNotFound as exc:
                box.state = {
                    "waiting": {
                        "reason": "ErrImagePull",
                        "message": (
                            f'test kubelet: image "{box.spec["image"]}" is not in the local Docker engine, and this '
                            f"kubelet never pulls ({exc.explanation})"
                        ),
                    }
                }
            except docker.errors.APIError as exc:
                if exc.status_code != 400:
                    raise
                box.state = {"waiting": {"reason": "InvalidImageName", "message": f"test kubelet: {exc.explanation}"}}
                self._idle()  # Kubernetes does not retry an invalid name
            self._sleep(delay)
            delay = min(delay * 2, IMAGE_BACKOFF[1])

    def _run_init(self, box: _Box, runtime: str | None) -> None:
        """Run an init container to completion; one that fails ends the Pod (Never) or runs again after backoff."""
        delay = 1.0
        for attempt in itertools.count():
            image = self._image(box)
            if box.docker_id:  # the failed attempt before
                with contextlib.suppress(Exception):
                    self.kubelet._docker.api.remove_container(box.docker_id, force=True)
            box.docker_id = self._create(box, image, runtime, attempt, owner=None).id
            self._start(box)
            while "terminated" not in box.state:
                self._pump(10)
                self._refresh()
            if box.exit_code == 0:
                return
            if self.restart_policy == "Never":
                self._idle()  # the Pod is Failed: Init:Error
            box.last_state, box.restarts = box.state, box.restarts + 1
            box.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {delay:.0f}s restarting failed container",
                }
            }
            self._sleep(delay)
            delay = min(delay * 2, 60.0)

    def _start_main(self, runtime: str | None) -> None:
        images = [self._image(box) for box in self.main_boxes]
        for box in self.main_boxes:
            box.state = {"waiting": {"reason": "ContainerCreating"}}
        owner = None
        for box, image in zip(self.main_boxes, images, strict=True):
            container = self._create(box, image, runtime, 0, owner=owner)
            box.docker_id = container.id
            owner = owner or container
            self._start(box)

    def _start(self, box: _Box) -> None:
        import docker.errors

        try:
            self.kubelet._docker.api.start(box.docker_id)
        except docker.errors.APIError as exc:  # e.g. its command is not in the image
            box.state = {
                "terminated": {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": str(exc.explanation),
                    "containerID": f"docker://{box.docker_id}",
                }
            }
            return
        self._refresh_box(box)

    def _create(self, box: _Box, image: Any, runtime: str | None, attempt: int, owner: Any) -> Any:
        """Create (not start) a container as the kubelet would run it; registers its Docker events."""
        kubelet = self.kubelet
        spec, pod_spec = box.spec, self.pod["spec"]
        env = self.env.get(box.name) or self._environment(spec)
        security = {**(pod_spec.get("securityContext") or {}), **(spec.get("securityContext") or {})}
        limits = _dig(spec, "resources", "limits", default={})
        requests = _dig(spec, "resources", "requests", default={})
        options: dict[str, Any] = {
            "image": image.id,
            "name": f"k8s_{box.name}_{self.pod_name}_{self.namespace}_{self.uid[:8]}_{attempt}",
            "labels": {
                **kubelet._labels(self.pod),
                f"{LABEL}/container": box.name,
                f"{LABEL}/kind": "init" if box.init else "main",
                "io.kubernetes.container.name": box.name,
            },
            "environment": [f"{key}={value}" for key, value in env.items()],
            "entrypoint": [_expand(part, env) for part in spec["command"]] if spec.get("command") else None,
            "command": [_expand(part, env) for part in spec["args"]] if spec.get("args") else None,
            "working_dir": spec.get("workingDir") or None,
            "mounts": self._mounts(spec),
            "tty": bool(spec.get("tty")),
            "stdin_open": bool(spec.get("stdin")),
            "runtime": runtime,
            "cap_add": _dig(security, "capabilities", "add"),
            "cap_drop": _dig(security, "capabilities", "drop"),
            "privileged": bool(security.get("privileged")),
            "read_only": bool(security.get("readOnlyRootFilesystem")),
            "group_add": [str(group) for group in _dig(pod_spec, "securityContext", "supplementalGroups", default=[])]
            or None,
            "security_opt": self._security_options(security),
            "user": self._user(security, image, box),
        }
        if cpu := _cpu_cores(limits.get("cpu")):
            options["nano_cpus"] = int(cpu * 1e9)
        if memory := _memory_bytes(limits.get("memory")):
            options["mem_limit"] = options["memswap_limit"] = memory
        if share := _cpu_cores(requests.get("cpu")):
            options["cpu_shares"] = max(2, int(share * 1024))
        if not box.init and self.restart_policy != "Never":
            options["restart_policy"] = {"Name": "always" if self.restart_policy == "Always" else "on-failure"}
        if self.host_network:  # the host's own network namespace: its ports are the host's
            options["network_mode"] = "host"
        elif owner is None:  # an init container, or the first main container: it owns the Pod's ports
            options["network"] = kubelet._network
            options["hostname"] = (pod_spec.get("hostname") or self.pod_name)[:63].rstrip("-.")
            if not box.init:
                options["ports"] = {
                    f"{port}/{protocol}": (self.address, port) for port, protocol in self._published_ports()
                }
        else:
            options["network_mode"] = f"container:{owner.id}"
        container = kubelet._docker.containers.create(**{k: v for k, v in options.items() if v is not None})
        kubelet._watch_container(container.id, self)
        if not box.init:
            box.probes = self._probes(box)
        return container

    def _mounts(self, container: Obj) -> list[Any]:
        """The container's volumeMounts, and its service account's files where none is mounted."""
        import docker.types

        mounts = [self._mount(mount) for mount in container.get("volumeMounts") or []]
        taken = {mount["mountPath"].rstrip("/") for mount in container.get("volumeMounts") or []}
        if self.service_account is not None and SERVICE_ACCOUNT_MOUNT not in taken:
            mounts.append(
                docker.types.Mount(SERVICE_ACCOUNT_MOUNT, str(self.service_account), type="bind", read_only=True)
            )
        return mounts

    def _mount(self, mount: Obj) -> Any:
        import docker.types

        if mount["name"] in self.host_paths:
            return docker.types.Mount(
                mount["mountPath"], self.host_paths[mount["name"]], type="bind", read_only=bool(mount.get("readOnly"))
            )
        return docker.types.Mount(
            target=mount["mountPath"],
            source=self.volumes[mount["name"]],
            type="volume",
            read_only=bool(mount.get("readOnly")),
            no_copy=True,
        )

    @staticmethod
    def _security_options(security: Obj) -> list[str] | None:
        options = []
        if security.get("allowPrivilegeEscalation") is False:
            options.append("no-new-privileges:true")
        if _dig(security, "seccompProfile", "type") != "RuntimeDefault":
            options.append("seccomp=unconfined")  # a 1.20 kubelet's default; RuntimeDefault is Docker's profile
        return options or None

    @staticmethod
    def _user(security: Obj, image: Any, box: _Box) -> str | None:
        user, group = security.get("runAsUser"), security.get("runAsGroup")
        image_user = (image.attrs.get("Config") or {}).get("User") or ""
        if security.get("runAsNonRoot") and user is None and image_user.split(":")[0] in ("", "0", "root"):
            raise _Unsupported(f"container {box.name!r} has runAsNonRoot and image will run as root")
        if security.get("runAsNonRoot") and user == 0:
            raise _Unsupported(f"container {box.name!r}'s runAsUser breaks non-root policy")
        if user is None and group is None:
            return None
        base = str(user) if user is not None else (image_user.split(":")[0] or "0")
        return f"{base}:{group}" if group is not None else base

    def _environment(self, container: Obj) -> dict[str, str]:
        """The container's environment, with `$(VAR)` of earlier entries expanded, fieldRefs and
        secretKeyRefs filled in, after the API server's variables (`TestKubelet.service_variables`)."""
        meta, spec, status = self.pod["metadata"], self.pod["spec"], self.pod.get("status") or {}
        env: dict[str, str] = dict(self.kubelet.service_variables())
        for item in container.get("env") or []:
            source = item.get("valueFrom")
            if source is None:
                env[item["name"]] = _expand(item.get("value") or "", env)
                continue
            if source.get("secretKeyRef"):
                value = self._secret_value(source["secretKeyRef"])
                if value is not None:
                    env[item["name"]] = value
                continue
            path = _dig(source, "fieldRef", "fieldPath")
            if path is None:
                raise _Unsupported(
                    f"test kubelet: env {item['name']!r}: only fieldRef sources are emulated, not {list(source)}"
                )
            fields = {
                "metadata.name": meta["name"],
                "metadata.namespace": meta["namespace"],
                "metadata.uid": meta["uid"],
                "spec.nodeName": spec.get("nodeName") or self.kubelet.node_name,
                "spec.serviceAccountName": spec.get("serviceAccountName") or "",
                "status.hostIP": HOST_IP,
                "status.podIP": self.address or status.get("podIP") or "",
                "status.podIPs": self.address or status.get("podIP") or "",
            }
            match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if match:
                env[item["name"]] = (meta.get(match[1]) or {}).get(match[2], "")
            elif path in fields:
                env[item["name"]] = fields[path]
            else:
                raise _Unsupported(f"test kubelet: env {item['name']!r}: fieldPath {path!r} is not emulated")
        return env

    def _secret_value(self, ref: Obj) -> str | None:
        """The value of a secretKeyRef (None for an optional one that is not there)."""
        path = f"/api/v1/namespaces/{quote(self.namespace)}/secrets/{quote(ref['name'])}"
        try:
            data = self.kubelet._api.call("GET", path).get("data") or {}
        except ApiError as exc:
            if exc.status != 404:
                raise
            data, missing = None, f'secret "{ref["name"]}" not found'
        else:
            missing = f"couldn't find key {ref['key']} in Secret {self.namespace}/{ref['name']}"
        if data is not None and ref["key"] in data:
            return base64.b64decode(data[ref["key"]]).decode(errors="replace")
        if ref.get("optional"):
            return None
        raise _Missing(f"test kubelet: {missing}")

    # -- states and probes --------------------------------------------------------------------

    def _docker_event(self, action: str, container_id: str, attributes: Obj, when: int | None) -> None:
        for box in self.init_boxes + self.main_boxes:
            if box.docker_id != container_id:
                continue
            if action == "oom":
                box.oom = True
            elif action == "die":  # kept: Docker may have restarted it before it is inspected
                code = int(attributes.get("exitCode") or 0)
                reason = "OOMKilled" if box.oom else ("Completed" if code == 0 else "Error")
                box.died = {"exitCode": code, "reason": reason, "containerID": f"docker://{box.docker_id}"}
                if when:
                    box.died["finishedAt"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
                box.oom = False
            self._refresh_box(box)

    def _refresh(self) -> None:
        for box in self.init_boxes + self.main_boxes:
            if box.docker_id and ("running" in box.state or "terminated" not in box.state):
                self._refresh_box(box)

    def _refresh_box(self, box: _Box) -> None:
        """The container's state as Docker has it now."""
        import docker.errors

        self._last_news = time.monotonic()
        try:
            attrs = self.kubelet._docker.api.inspect_container(box.docker_id)
        except docker.errors.NotFound:
            return
        state = attrs["State"]
        restarts = int(attrs.get("RestartCount") or 0)
        if restarts > box.restarts:  # Docker restarted it (restartPolicy Always/OnFailure)
            box.last_state = box.state if "terminated" in box.state else ({"terminated": box.died} if box.died else {})
            box.restarts = restarts
            for probe in box.probes:
                probe.successes = probe.failures = 0
        if state.get("Restarting"):
            if "terminated" in box.state:
                box.last_state = box.state
            box.state = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}}
            box.ready = box.started = False
        elif state.get("Running"):
            if "running" not in box.state:
                box.state = {"running": {"startedAt": _docker_time(state.get("StartedAt")) or _now()}}
                box.ready = False
                box.started = not any(probe.kind == "startup" for probe in box.probes)
                delay = time.monotonic()
                for probe in box.probes:
                    probe.due = delay + probe.setting("initialDelaySeconds", 0)
                if not box.init and not any(probe.kind == "readiness" for probe in box.probes):
                    box.ready = box.started
        elif state.get("Status") in ("exited", "dead") or (
            state.get("FinishedAt") and not state["FinishedAt"].startswith("0001-")
        ):
            code = int(state.get("ExitCode") or 0)
            reason = "OOMKilled" if state.get("OOMKilled") else ("Completed" if code == 0 else "Error")
            terminated = {"exitCode": code, "reason": reason, "containerID": f"docker://{box.docker_id}"}
            if started := _docker_time(state.get("StartedAt")):
                terminated["startedAt"] = started
            if finished := _docker_time(state.get("FinishedAt")):
                terminated["finishedAt"] = finished
            if state.get("Error"):
                terminated["message"] = state["Error"]
            box.state = {"terminated": terminated}
            box.ready = box.init and code == 0
            box.started = False

    def _probe(self, box: _Box, probe: _Probe) -> None:
        """Run one due probe and apply its thresholds, as the kubelet's prober does."""
        probe.due = time.monotonic() + probe.setting("periodSeconds", 10)
        if (probe.kind == "startup") == box.started:  # startup probes run until started, the others after
            return
        ok = probe.check()
        probe.successes, probe.failures = (probe.successes + 1, 0) if ok else (0, probe.failures + 1)
        if probe.kind == "readiness":
            if ok and probe.successes >= probe.setting("successThreshold", 1):
                box.ready = True
            elif not ok and probe.failures >= probe.setting("failureThreshold", 3):
                box.ready = False
        elif ok:
            if probe.kind == "startup":
                box.started = True
                box.ready = box.ready or not any(p.kind == "readiness" for p in box.probes)
        elif probe.failures >= probe.setting("failureThreshold", 3):  # startup or liveness failed: kill it
            with contextlib.suppress(Exception):
                self.kubelet._docker.api.kill(box.docker_id)

    def _probes(self, box: _Box) -> list[_Probe]:
        named = {port["name"]: int(port["containerPort"]) for port in box.spec.get("ports") or [] if port.get("name")}
        probes = []
        for kind in ("startup", "readiness", "liveness"):
            spec = box.spec.get(f"{kind}Probe")
            if not spec:
                continue
            action = spec.get("tcpSocket") or spec["httpGet"]
            target = action["port"]
            port = named[target] if isinstance(target, str) and not target.isdigit() else int(target)
            host = action.get("host") or self.address or HOST_IP
            probes.append(_Probe(kind, spec, port, host, due=float("inf")))
        return probes

    # -- the status ---------------------------------------------------------------------------

    def _phase(self) -> str:
        """The Pod's phase from its containers' states, as the kubelet derives it."""
        for box in self.init_boxes:
            if box.exit_code not in (None, 0) and self.restart_policy == "Never":
                return "Failed"
            if box.exit_code != 0:
                return "Pending"
        states = [next(iter(box.state), "waiting") for box in self.main_boxes]
        if any(state == "waiting" and not box.last_state for state, box in zip(states, self.main_boxes, strict=True)):
            return "Pending"
        if "running" in states:
            return "Running"
        if self.restart_policy == "Always" or "waiting" in states:  # waiting: to be restarted
            return "Running"
        if all(box.exit_code == 0 for box in self.main_boxes):
            return "Succeeded"
        return "Failed" if self.restart_policy == "Never" else "Running"

    def _condition(self, kind: str, ok: bool, reason: str = "", message: str = "") -> Obj:
        value = "True" if ok else "False"
        if self._transitions.get(kind, ("", ""))[0] != value:
            self._transitions[kind] = (value, _now())
        condition = {
            "type": kind,
            "status": value,
            "lastProbeTime": None,
            "lastTransitionTime": self._transitions[kind][1],
        }
        if not ok:
            condition |= {"reason": reason, "message": message}
        return condition

    def status(self) -> Obj:
        phase = self._phase()
        incomplete = [box.name for box in self.init_boxes if box.exit_code != 0]
        unready = [box.name for box in self.main_boxes if not box.ready]
        not_ready = "PodCompleted" if phase in FINAL_PHASES else "ContainersNotReady"
        unready_message = f"containers with unready status: [{' '.join(unready)}]"
        status: Obj = {
            "phase": phase,
            "conditions": [
                self._condition(
                    "Initialized",
                    not incomplete,
                    "ContainersNotInitialized",
                    f"containers with incomplete status: [{' '.join(incomplete)}]",
                ),
                self._condition("Ready", phase == "Running" and not unready, not_ready, unready_message),
                self._condition("ContainersReady", phase == "Running" and not unready, not_ready, unready_message),
                self._condition("PodScheduled", True),
            ],
            "hostIP": HOST_IP,
            "startTime": self.start_time,
            "containerStatuses": [box.status() for box in self.main_boxes],
        }
        if self.init_boxes:
            status["initContainerStatuses"] = [box.status() for box in self.init_boxes]
        if self.address:
            status |= {"podIP": self.address, "podIPs": [{"ip": self.address}]}
        return status

    def _flush(self) -> None:
        """Write the status if it changed since the last successful write."""
        if self.leave:
            return
        status = self.status()
        if status == self._written:
            return
        try:
            self.kubelet._write_status(self.namespace, self.pod_name, status, retry_for=2.0)
        except ApiError as exc:
            if exc.status == 404:
                self.leave = "gone"
                return
            self._failed_write = True
            return
        except (urllib3.exceptions.HTTPError, OSError):
            self._failed_write = True
            return
        self._written, self._failed_write = status, False


@dataclass
class _Record:
    """What the kubelet knows of one Pod (by uid) beyond the watched object itself."""

    uid: str
    namespace: str
    name: str
    bound: bool = False
    unschedulable: bool = False
    status_written: bool = False
    killed: bool = False
    address: str | None = None
    runner: _PodRunner | None = None
    failures: int = 0


class TestKubelet:
    """The node of a real API server for tests; see the module docstring for what it emulates.

    `api_client` is a `kubernetes.client.ApiClient` (admin rights: it binds Pods and writes their
    status); `docker_client` a Docker SDK client (not needed in "status-only" mode); `namespace`
    limits it to one namespace (None: all); `labels` are added to the Node's labels.
    """

    __test__ = False  # a test double, not a pytest test class

    def __init__(
        self,
        api_client: Any,
        docker_client: Any = None,
        *,
        namespace: str | None = None,
        node_name: str = "orchard-test-node",
        mode: Mode = "containers",
        labels: dict[str, str] | None = None,
        workers: int = 16,
    ) -> None:
        if mode not in ("containers", "status-only"):
            raise ValueError(f"mode must be 'containers' or 'status-only', not {mode!r}")
        if mode == "containers" and docker_client is None:
            raise ValueError("containers mode needs a Docker client")
        self.node_name, self.mode, self.namespace = node_name, mode, namespace
        self.instance = f"{os.getpid()}-{os.urandom(3).hex()}"
        self.node_labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine()),
            f"{LABEL}/mode": mode,
            **(labels or {}),
        }
        self.errors: list[str] = []
        self.stats: dict[str, int] = {"binds": 0, "status_writes": 0, "deletes": 0, "relists": 0, "watches": 0}
        self._api = _Api(api_client)
        self._api_server = urlsplit(api_client.configuration.host)
        ca_file = api_client.configuration.ssl_ca_cert
        self._ca = Path(ca_file).read_bytes() if ca_file else b""
        self._docker = docker_client
        self._workers = workers
        self._network: str | None = None
        self._loopback = _Loopback()
        self._fake = _FakeAddresses()
        self._lock = threading.RLock()
        self._cache: dict[str, Obj] = {}
        self._records: dict[str, _Record] = {}
        self._seen: set[tuple[str, str]] = set()
        self._containers: dict[str, _PodRunner] = {}
        self._queue = _WorkQueue()
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch_response: Any = None
        self._events: Any = None
        self._events_ready = threading.Event()
        self._started = False

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> TestKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> TestKubelet:
        """Register the node and start watching; returns once the first LIST is in."""
        if self._started:
            raise RuntimeError("this test kubelet has been started already")
        self._started = True
        try:
            if self.mode == "containers":
                self._remove_dead_kubelets_objects()
                self._network = f"orchard-kubelet-{self.instance}"
                self._docker.networks.create(self._network, driver="bridge", labels=self._base_labels())
                self._spawn(self._docker_events, "docker events")
                if not self._events_ready.wait(timeout):
                    raise RuntimeError("test kubelet: the Docker event stream did not open")
            self._register_node()
            self._spawn(self._watch_loop, "watch")
            for index in range(self._workers):
                self._spawn(self._work_loop, f"worker {index}")
            if not self._synced.wait(timeout):
                raise RuntimeError(
                    f"test kubelet: no Pod list from the API server in {timeout:.0f}s; errors: {self.errors[-3:]}"
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every thread and remove everything it created (containers, volumes, network, Node)."""
        self._stopping.set()
        self._queue.close()
        with contextlib.suppress(Exception):
            if self._watch_response is not None:
                self._watch_response.shutdown()
        for thread in self._threads:  # the watch and the workers first: no runner starts after this
            if thread.name != "test-kubelet docker events":
                thread.join(15)
        with self._lock:
            runners = [record.runner for record in self._records.values() if record.runner]
        for runner in runners:
            runner.post(("stop",))
        for runner in runners:
            runner.join(STOP_GRACE_MAX + 30)
        with contextlib.suppress(Exception):
            if self._events is not None:
                self._events.close()
        for thread in self._threads:
            thread.join(10)
        if self._docker is not None:
            self._remove_objects({f"{LABEL}/instance": self.instance})
        self._loopback.release_all()
        with contextlib.suppress(Exception):
            self._api.call("DELETE", f"/api/v1/nodes/{quote(self.node_name)}", retry_for=2.0, timeout=5.0)

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=f"test-kubelet {name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1

    def _error(self, where: str, exc: BaseException) -> None:
        """Keep going, but remember: a test can assert `kubelet.errors == []`."""
        if self._stopping.is_set():
            return
        log.warning("test kubelet: %s: %r", where, exc, exc_info=exc)
        with self._lock:
            self.errors.append(f"{where}: {exc!r}")

    def service_variables(self) -> dict[str, str]:
        """What a kubelet puts in every container's environment for the `kubernetes` Service: here
        the API server's own loopback address and port (no kube-proxy routes a cluster IP here)."""
        host, port = self._api_server.hostname or HOST_IP, str(self._api_server.port or 443)
        return {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
        }

    # -- what tests use -----------------------------------------------------------------------

    @property
    def pods_seen(self) -> set[tuple[str, str]]:
        """(namespace, name) of every Pod the watch has shown it, in any state."""
        with self._lock:
            return set(self._seen)

    def address(self, name: str, namespace: str | None = None) -> str | None:
        """The podIP this kubelet gave a live Pod, or None."""
        record = self._find(name, namespace)
        if record is None:
            return None
        return record.runner.address if record.runner else record.address

    def containers(self, name: str, namespace: str | None = None) -> list[Any]:
        """The Docker containers of a Pod (any state), init containers first."""
        filters = {"label": [f"{LABEL}/instance={self.instance}", f"{LABEL}/pod-name={name}"]}
        if namespace or self.namespace:
            filters["label"].append(f"{LABEL}/pod-namespace={namespace or self.namespace}")
        found = self._docker.containers.list(all=True, filters=filters, ignore_removed=True)
        return sorted(found, key=lambda c: (c.labels.get(f"{LABEL}/kind") != "init", c.attrs.get("Created", "")))

    def kill(self, name: str, namespace: str | None = None, container: str | None = None) -> None:
        """Kill a Pod's main container (the first, or `container`) as an OOM killer or a crash would:
        SIGKILL, exit 137. In status-only mode the status says the same."""
        record = self._find(name, namespace)
        if record is None:
            raise LookupError(f"test kubelet: no live Pod {name!r}")
        if self.mode == "status-only":
            record.killed = True
            self._queue.add(record.uid)
            return
        if record.runner is None:
            raise LookupError(f"test kubelet: Pod {name!r} does not run here (not bound, or finished)")
        boxes = [box for box in record.runner.main_boxes if container in (None, box.name)]
        if not boxes or not boxes[0].docker_id:
            raise LookupError(f"test kubelet: Pod {name!r} has no running container {container or ''}")
        self._docker.api.kill(boxes[0].docker_id)

    def leftovers(self) -> list[str]:
        """Docker containers and volumes this kubelet made that still exist (empty after deletions)."""
        if self._docker is None:
            return []
        label = {"label": f"{LABEL}/instance={self.instance}"}
        containers = [
            f"container {c.name}" for c in self._docker.containers.list(all=True, filters=label, ignore_removed=True)
        ]
        volumes = [f"volume {v.name}" for v in self._docker.volumes.list(filters=label)]
        return containers + volumes

    def _find(self, name: str, namespace: str | None) -> _Record | None:
        with self._lock:
            matches = [
                record
                for uid, record in self._records.items()
                if record.name == name and namespace in (None, record.namespace) and uid in self._cache
            ]
        if len(matches) > 1:
            raise LookupError(f"test kubelet: Pod {name!r} is in several namespaces: say which")
        return matches[0] if matches else None

    # -- Docker -------------------------------------------------------------------------------

    def _base_labels(self) -> dict[str, str]:
        return {
            LABEL: "1",
            f"{LABEL}/instance": self.instance,
            f"{LABEL}/pid": str(os.getpid()),
            f"{LABEL}/node": self.node_name,
        }

    def _labels(self, pod: Obj) -> dict[str, str]:
        namespace, name = _pod_key(pod)
        uid = pod["metadata"]["uid"]
        return {
            **self._base_labels(),
            f"{LABEL}/pod-namespace": namespace,
            f"{LABEL}/pod-name": name,
            f"{LABEL}/pod-uid": uid,
            "io.kubernetes.pod.namespace": namespace,
            "io.kubernetes.pod.name": name,
            "io.kubernetes.pod.uid": uid,
        }

    def _remove_objects(self, labels: dict[str, str]) -> None:
        """Remove the containers, then volumes, then networks that carry `labels`."""
        selector = {"label": [f"{key}={value}" for key, value in labels.items()]}
        for container in self._docker.containers.list(all=True, filters=selector, ignore_removed=True):
            with contextlib.suppress(Exception):
                container.remove(force=True)
        for volume in self._docker.volumes.list(filters=selector):
            with contextlib.suppress(Exception):
                volume.remove(force=True)
        for network in self._docker.networks.list(filters=selector):
            with contextlib.suppress(Exception):
                network.remove()

    def _remove_dead_kubelets_objects(self) -> None:
        """What test kubelets of processes no longer running left behind (a killed test run)."""
        labels = [
            c.labels for c in self._docker.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
        ]
        labels += [v.attrs.get("Labels") or {} for v in self._docker.volumes.list(filters={"label": LABEL})]
        labels += [n.attrs.get("Labels") or {} for n in self._docker.networks.list(filters={"label": LABEL})]
        pids = {found.get(f"{LABEL}/pid") for found in labels} - {None, "", str(os.getpid())}
        for pid in pids:
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                self._remove_objects({LABEL: "1", f"{LABEL}/pid": pid})
            except (PermissionError, ValueError):
                pass

    def _watch_container(self, container_id: str, runner: _PodRunner) -> None:
        with self._lock:
            self._containers[container_id] = runner

    def _forget_container(self, container_id: str | None) -> None:
        with self._lock:
            self._containers.pop(container_id or "", None)

    def _docker_events(self) -> None:
        """Docker's start/die/oom events of this kubelet's containers, to their Pods' runners."""
        since = int(time.time()) - 1
        while not self._stopping.is_set():
            try:
                self._events = self._docker.api.events(
                    since=since,
                    decode=True,
                    filters={"type": ["container"], "label": [f"{LABEL}/instance={self.instance}"]},
                )
                self._events_ready.set()
                for event in self._events:
                    since = max(since, int(event.get("time") or since))
                    action = (event.get("Action") or event.get("status") or "").split(":")[0]
                    with self._lock:
                        runner = self._containers.get(event.get("id", ""))
                    if runner is not None and action in ("start", "die", "oom"):
                        attributes = (event.get("Actor") or {}).get("Attributes") or {}
                        runner.post(("docker", action, event["id"], attributes, event.get("time")))
            except Exception as exc:
                if self._stopping.is_set():
                    return
                self._error("docker events", exc)
                self._stopping.wait(1.0)

    # -- the API server -----------------------------------------------------------------------

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{quote(self.namespace)}/pods" if self.namespace else "/api/v1/pods"

    def _register_node(self) -> None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        disk = shutil.disk_usage("/").total
        capacity = {
            "cpu": str(os.cpu_count() or 1),
            "memory": f"{memory // 1024}Ki",
            "ephemeral-storage": f"{disk // 1024}Ki",
            "pods": "1100",
        }
        now = _now()

        def condition(kind: str, value: str, reason: str, message: str) -> Obj:
            return {
                "type": kind,
                "status": value,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }

        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                condition(
                    "MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"
                ),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition(
                    "Ready", "True", "KubeletReady", f"orchard test kubelet ({self.mode}) is posting ready status"
                ),
            ],
            "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": self.node_name}],
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": platform.release(),
                "osImage": "orchard test kubelet",
                "operatingSystem": "linux",
                "architecture": self.node_labels["kubernetes.io/arch"],
                "containerRuntimeVersion": "docker://" if self.mode == "containers" else "none://",
                "kubeletVersion": "v1.20.2-orchard-test",
                "kubeProxyVersion": "",
            },
        }
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": self.node_labels},
            "spec": {},
            "status": status,
        }
        path = f"/api/v1/nodes/{quote(self.node_name)}"
        try:
            self._api.call("POST", "/api/v1/nodes", body=node, retry_for=30.0)
        except ApiError as exc:
            if exc.status != 409:
                raise
            self._api.call(
                "PATCH",
                path,
                body={"metadata": {"labels": self.node_labels}, "spec": {"unschedulable": None}},
                content_type=MERGE_PATCH,
            )
        self._api.call("PATCH", f"{path}/status", body={"status": status}, content_type=MERGE_PATCH)

    def _watch_loop(self) -> None:
        """LIST, then WATCH from its resourceVersion; relist on 410, reconnect with backoff on errors."""
        version: str | None = None
        delay = 0.1
        while not self._stopping.is_set():
            try:
                if version is None:
                    version = self._relist()
                version = self._watch(version)
                delay = 0.1
            except _Gone:
                version = None
            except Exception as exc:
                if self._stopping.is_set():
                    return
                if not isinstance(exc, (urllib3.exceptions.HTTPError, OSError, ApiError)):
                    self._error("watch", exc)
                log.info("test kubelet: watch broke (%r); again in %.1fs", exc, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, 3.0)

    def _relist(self) -> str:
        answer = self._api.call("GET", self._pods_path(), retry_for=5.0)
        self._count("relists")
        pods = {pod["metadata"]["uid"]: pod for pod in answer["items"]}
        with self._lock:
            vanished = set(self._cache) - set(pods)
            for uid in vanished:
                del self._cache[uid]
            self._cache.update(pods)
            self._seen |= {_pod_key(pod) for pod in pods.values()}
        for uid in [*pods, *vanished]:
            self._queue.add(uid)
        self._synced.set()
        return answer["metadata"]["resourceVersion"]

    def _watch(self, version: str) -> str:
        """Follow one watch until the server ends it; returns the last resourceVersion seen."""
        query = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true", "timeoutSeconds": "240"}
        try:
            response = self._api.open("GET", self._pods_path(), query=query, timeout=270.0, stream=True)
        except ApiError as exc:
            if exc.status == 410:
                raise _Gone from None
            raise
        self._watch_response = response
        self._count("watches")
        if self._stopping.is_set():
            response.shutdown()
        buffer = b""
        try:
            for chunk in response.stream(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        version = self._event(json.loads(line), version)
        finally:
            response.release_conn()
        return version

    def _event(self, event: Obj, version: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise ApiError(int(obj.get("code") or 500), json.dumps(obj).encode())
        version = _dig(obj, "metadata", "resourceVersion", default=version)
        if kind == "BOOKMARK":
            return version
        uid = obj["metadata"]["uid"]
        with self._lock:
            if kind == "DELETED":
                self._cache.pop(uid, None)
            else:
                self._cache[uid] = obj
                self._seen.add(_pod_key(obj))
        self._queue.add(uid)
        return version

    def _write_status(self, namespace: str, name: str, status: Obj, retry_for: float = 10.0) -> None:
        self._api.call(
            "PATCH",
            pod_path(namespace, name, "status"),
            body={"status": status},
            content_type=MERGE_PATCH,
            retry_for=retry_for,
            answer=False,
        )
        self._count("status_writes")

    def _delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the Pod object at once (grace 0), only the incarnation with this uid."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        try:
            self._api.call("DELETE", pod_path(namespace, name), body=body, retry_for=60.0, answer=False)
            self._count("deletes")
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone already, or another Pod by now has that name
                self._error(f"deleting pod {namespace}/{name}", exc)
        except Exception as exc:
            self._error(f"deleting pod {namespace}/{name}", exc)

    # -- reconciling --------------------------------------------------------------------------

    def _work_loop(self) -> None:
        while (uid := self._queue.get()) is not None:
            try:
                self._reconcile(uid)
                with self._lock:
                    record = self._records.get(uid)
                    if record:
                        record.failures = 0
            except Exception as exc:
                with self._lock:
                    record = self._records.get(uid)
                    if record is not None:
                        record.failures += 1
                    failures = record.failures if record is not None else 1
                transient = isinstance(exc, (urllib3.exceptions.HTTPError, OSError)) or (
                    isinstance(exc, ApiError) and exc.status in _Api.RETRIED
                )
                if not transient and failures > 2:
                    self._error(f"pod {uid}", exc)
                self._queue.add_after(uid, min(0.2 * 2**failures, 5.0))
            finally:
                self._queue.done(uid)

    def _reconcile(self, uid: str) -> None:
        """Bring one Pod one step on: bind it, run (or fake) it, or end it."""
        with self._lock:
            pod = self._cache.get(uid)
            record = self._records.get(uid)
            if pod is not None and record is None:
                record = self._records[uid] = _Record(uid, *_pod_key(pod))
        if pod is None:
            self._gone(uid, record)
            return
        assert record is not None
        meta, spec = pod["metadata"], pod["spec"]
        node = spec.get("nodeName") or (self.node_name if record.bound else None)
        if node is None:
            if (
                not meta.get("deletionTimestamp")
                and (spec.get("schedulerName") or DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER
            ):
                self._schedule(pod, record)
            if not record.bound:
                return
        elif node != self.node_name:
            return
        if self.mode == "status-only":
            self._fake_run(pod, record)
        else:
            self._run(pod, record)

    def _gone(self, uid: str, record: _Record | None) -> None:
        """The Pod was deleted from the API server: stop what runs it."""
        if record is None:
            return
        if record.runner is not None:
            record.runner.post(("gone",))
            return  # the runner forgets the record when it is done
        self._fake.release(record.address)
        with self._lock:
            self._records.pop(uid, None)

    def _schedule(self, pod: Obj, record: _Record) -> None:
        meta = pod["metadata"]
        selector = pod["spec"].get("nodeSelector") or {}
        misses = {key: value for key, value in selector.items() if self.node_labels.get(key) != value}
        if misses:
            if not record.unschedulable:
                condition = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 node(s) didn't match node selector.",
                    "lastProbeTime": None,
                    "lastTransitionTime": _now(),
                }
                self._write_status(meta["namespace"], meta["name"], {"phase": "Pending", "conditions": [condition]})
                record.unschedulable = True
            return
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            self._api.call("POST", pod_path(meta["namespace"], meta["name"], "binding"), body=binding, answer=False)
        except ApiError as exc:
            if exc.status in (404, 409):  # deleted meanwhile, or bound already: the watch tells which
                return
            raise
        record.bound = True
        self._count("binds")

    def _run(self, pod: Obj, record: _Record) -> None:
        deleting = bool(pod["metadata"].get("deletionTimestamp"))
        if record.runner is not None:
            record.runner.post(("pod", pod))
        elif deleting:  # nothing runs it (a finished Pod, or one from before this kubelet)
            self._delete_pod(*_pod_key(pod), pod["metadata"]["uid"])
        elif _dig(pod, "status", "phase") not in FINAL_PHASES and not self._stopping.is_set():
            record.runner = _PodRunner(self, pod)
            record.runner.start()

    def _runner_done(self, runner: _PodRunner) -> None:
        with self._lock:
            record = self._records.get(runner.uid)
            if record is not None and record.runner is runner:
                record.runner = None
                if runner.uid not in self._cache or runner.leave == "delete":
                    self._records.pop(runner.uid, None)

    def _fake_run(self, pod: Obj, record: _Record) -> None:
        """status-only: Running and Ready at once, Failed once killed; deleted at once when asked."""
        meta, spec = pod["metadata"], pod["spec"]
        if meta.get("deletionTimestamp"):
            self._delete_pod(meta["namespace"], meta["name"], meta["uid"])
            return
        if record.status_written and not record.killed:
            return
        if record.killed and _dig(pod, "status", "phase") == "Failed":
            return
        record.address = record.address or self._fake.acquire()
        now = _now()
        true = [
            {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ]

        def container(item: Obj, state: Obj, ready: bool) -> Obj:
            return {
                "name": item["name"],
                "image": item.get("image", ""),
                "imageID": "status-only://",
                "containerID": f"status-only://{meta['uid']}/{item['name']}",
                "state": state,
                "lastState": {},
                "ready": ready,
                "started": ready,
                "restartCount": 0,
            }

        status = {
            "phase": "Running",
            "conditions": true,
            "hostIP": HOST_IP,
            "startTime": now,
            "podIP": record.address,
            "podIPs": [{"ip": record.address}],
            "initContainerStatuses": [
                container(item, {"terminated": {"exitCode": 0, "reason": "Completed"}}, True)
                for item in spec.get("initContainers") or []
            ],
            "containerStatuses": [
                container(item, {"running": {"startedAt": now}}, True) for item in spec["containers"]
            ],
        }
        if record.killed:
            killed = {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now}}
            status |= {
                "phase": "Failed" if (spec.get("restartPolicy") or "Always") == "Never" else "Running",
                "conditions": [
                    {**c, "status": "False", "reason": "PodCompleted"}
                    if c["type"] in ("Ready", "ContainersReady")
                    else c
                    for c in true
                ],
                "containerStatuses": [container(item, killed, False) for item in spec["containers"]],
            }
        self._write_status(meta["namespace"], meta["name"], status)
        record.status_written = True

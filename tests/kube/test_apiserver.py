"""The test API server is a real one: it validates, dry-runs, authorizes, serves list+watch (410 Gone
after its own restart, as a real one), and keeps a bound Pod a kubelet must finish deleting."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import cluster
import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException


def _pod(name: str, **spec) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/managed-by": "orchard"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="sandbox", image="busybox")], **spec),
    )


def _names(pods: client.V1PodList) -> list[str]:
    return sorted(pod.metadata.name for pod in pods.items)


def test_the_kubeconfig_reaches_the_server_as_admin(kube):
    """The kubeconfig file (token, CA) is what a backend is pointed at; the admin may do anything."""
    with config.new_client_from_config(config_file=str(kube.kubeconfig)) as api:
        names = [ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items]
        review = client.AuthorizationV1Api(api).create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=client.V1ResourceAttributes(verb="*", resource="*")
                )
            )
        )
    assert "default" in names
    assert review.status.allowed


def test_dry_run_validates_without_storing(kube, kube_namespace):
    """A server-side dry run rejects what the server would (a bad enum value) and stores nothing."""
    with kube.client() as api:
        core = client.CoreV1Api(api)
        checked = core.create_namespaced_pod(kube_namespace, _pod("checked"), dry_run="All")
        with pytest.raises(ApiException) as rejected:
            core.create_namespaced_pod(kube_namespace, _pod("bad", restart_policy="Sometimes"), dry_run="All")
        stored = core.list_namespaced_pod(kube_namespace)
        core.create_namespaced_pod(kube_namespace, _pod("real"))
        after = core.list_namespaced_pod(kube_namespace)
    assert checked.metadata.name == "checked" and checked.spec.containers[0].image == "busybox"
    assert rejected.value.status == 422 and "restartPolicy" in rejected.value.body
    assert _names(stored) == [] and _names(after) == ["real"]


def test_a_watch_from_a_list_sees_each_change_once_in_order(kube, kube_namespace):
    """LIST, then WATCH from the list's resourceVersion: every change after it, once, in order. A delete
    comes as MODIFIED (deletionTimestamp set) and then DELETED, even for an unbound Pod that goes at once."""
    with kube.client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(kube_namespace, _pod("old"))
        listed = core.list_namespaced_pod(kube_namespace)
        core.create_namespaced_pod(kube_namespace, _pod("new"))
        core.patch_namespaced_pod("old", kube_namespace, {"metadata": {"labels": {"seen": "yes"}}})
        core.delete_namespaced_pod("new", kube_namespace)
        events = _events(core, kube_namespace, listed.metadata.resource_version, count=4)
    assert _names(listed) == ["old"]
    assert events == [
        ("ADDED", "new"),
        ("MODIFIED", "old"),
        ("MODIFIED", "new"),
        ("DELETED", "new"),
    ]


def test_after_a_restart_an_old_resource_version_is_gone_and_a_relist_resumes(kube, kube_namespace):
    """A restarted API server's watch cache starts at etcd's revision then: a watch from an older
    resourceVersion (anything written since, here a ConfigMap) gets 410 Gone, as from a real one, and
    a client relists. The relist has what changed meanwhile, and a watch from it goes on."""
    with kube.client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(kube_namespace, _pod("before"))
        last_seen = core.list_namespaced_pod(kube_namespace).metadata.resource_version
        core.create_namespaced_config_map(
            kube_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="other"))
        )
        kube.restart()
        core.create_namespaced_pod(kube_namespace, _pod("during"))
        with pytest.raises(ApiException) as gone:
            _events(core, kube_namespace, last_seen, count=1)
        relisted = core.list_namespaced_pod(kube_namespace)
        core.create_namespaced_pod(kube_namespace, _pod("after"))
        events = _events(core, kube_namespace, relisted.metadata.resource_version, count=1)
    assert gone.value.status == 410
    assert _names(relisted) == ["before", "during"]
    assert events == [("ADDED", "after")]


def test_a_bound_pod_stays_until_deleted_with_grace_zero(kube, kube_namespace):
    """No kubelet, no controller: a Pod bound to a node and deleted gracefully only gets a
    deletionTimestamp; the delete with grace 0 (a kubelet's) removes it. An unbound Pod goes at once."""
    with kube.client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(kube_namespace, _pod("bound"))
        core.create_namespaced_pod(kube_namespace, _pod("unbound"))
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name="bound"),
            target=client.V1ObjectReference(kind="Node", name="orchard-test-node"),
        )
        core.create_namespaced_binding(kube_namespace, binding, _preload_content=False)
        core.delete_namespaced_pod("unbound", kube_namespace)
        core.delete_namespaced_pod("bound", kube_namespace)
        terminating = core.read_namespaced_pod("bound", kube_namespace)
        left = core.list_namespaced_pod(kube_namespace)
        core.delete_namespaced_pod("bound", kube_namespace, grace_period_seconds=0)
        gone = core.list_namespaced_pod(kube_namespace)
    assert terminating.spec.node_name == "orchard-test-node" and terminating.metadata.deletion_timestamp is not None
    assert _names(left) == ["bound"] and _names(gone) == []


def test_rbac_holds_a_service_account_to_its_role(kube, kube_namespace):
    """Authorization is RBAC, and service-account tokens come from the TokenRequest API: a service account
    may do nothing until a Role bound to it allows listing Pods, and then only in its namespace."""
    with kube.client() as api:
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        core.create_namespaced_service_account(
            kube_namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="svc"))
        )
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
        )
        token = core.create_namespaced_service_account_token("svc", kube_namespace, request).status.token
        with kube.client(token) as as_account:
            denied = _status(lambda: client.CoreV1Api(as_account).list_namespaced_pod(kube_namespace))
            rbac.create_namespaced_role(
                kube_namespace,
                client.V1Role(
                    metadata=client.V1ObjectMeta(name="pods"),
                    rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])],
                ),
            )
            rbac.create_namespaced_role_binding(
                kube_namespace,
                client.V1RoleBinding(
                    metadata=client.V1ObjectMeta(name="pods"),
                    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pods"),
                    subjects=[client.RbacV1Subject(kind="ServiceAccount", name="svc", namespace=kube_namespace)],
                ),
            )
            allowed = _eventually_allowed(lambda: client.CoreV1Api(as_account).list_namespaced_pod(kube_namespace))
            elsewhere = _status(lambda: client.CoreV1Api(as_account).list_namespaced_pod("default"))
    assert (denied, allowed, elsewhere) == (403, 200, 403)


def test_a_pretty_printed_answer_is_indented_json_and_the_server_goes_on(kube, kube_namespace):
    """`?pretty=true`, and curl's user agent (for which the server pretty-prints by itself), get indented
    JSON with sorted map keys, and the server stays up. (Built with Go >= 1.18, 1.20's vendored reflect2
    1.0.1 made json-iterator's sorted-map encoder die with SIGSEGV: `./dev kube` puts in reflect2 1.0.2.)"""
    with kube.client() as api:
        labels, data = {"b": "2", "a": "1"}, {"y": "first", "x": "second"}
        config_map = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="pretty", labels=labels), data=data)
        client.CoreV1Api(api).create_namespaced_config_map(kube_namespace, config_map)
    path = f"/api/v1/namespaces/{kube_namespace}/configmaps/pretty"
    try:
        by_query = _get(kube, f"{path}?pretty=true")
        by_agent = _get(kube, path, user_agent="curl/7.88.1")
        nodes = _get(kube, "/api/v1/nodes?pretty=true")
        ready = _get(kube, "/readyz")
    finally:
        if not kube.running:  # start it again for the session's other tests, then say what happened
            crash = _crash_lines(kube)
            kube.stop()
            kube.start()
            pytest.fail(f"kube-apiserver died on a pretty-printed answer; its log:\n{crash}")
    for status, body in (by_query, by_agent):
        assert status == 200
        assert body.startswith('{\n  "kind": "ConfigMap",\n  "apiVersion": "v1",\n'), body
        assert '\n    "labels": {\n      "a": "1",\n      "b": "2"\n    }' in body, body
        assert '\n  "data": {\n    "x": "second",\n    "y": "first"\n  }' in body, body
        assert json.loads(body)["data"] == data
    assert nodes[0] == 200 and nodes[1].startswith('{\n  "kind": "NodeList",\n')
    assert ready == (200, "ok") and kube.running


@pytest.mark.parametrize(
    ("stop_signal", "to_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["ctrl-c-to-a-background-job", "sigterm"],
)
def test_the_script_stops_at_once_and_cleanly_after_its_api_server_died(docker_client, stop_signal, to_group):
    """`python tests/kube/cluster.py` (by hand: a cluster and the test kubelet until Ctrl-C), its
    kube-apiserver killed: Ctrl-C (SIGINT to its process group, as a terminal sends it; here to a
    background job of a non-interactive shell, which starts with SIGINT ignored) or SIGTERM ends it
    within 30 s, with no etcd or kube-apiserver left, nothing of its test kubelet in Docker, and no
    state folder or etcd data.
    Slow: a real etcd, kube-apiserver and test kubelet start in a subprocess (15-30 s on 2 cores)."""
    try:
        cluster._check_installed()
    except cluster.ClusterMissing as exc:
        pytest.fail(str(exc))
    script = Path(cluster.__file__)
    process = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=script.parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    output: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(process.stdout, output), daemon=True).start()
    try:
        folder = _ready_folder(output, deadline=time.monotonic() + 150)
        apiserver = _pids(f"--cert-dir={folder}")
        assert len(apiserver) == 1, apiserver
        os.kill(apiserver[0], signal.SIGKILL)
        _wait_until(lambda: not _pids(f"--cert-dir={folder}"), within=10)
        time.sleep(1)  # the test kubelet's watch breaks and it starts retrying
        began = time.monotonic()
        (os.killpg if to_group else os.kill)(process.pid, stop_signal)
        status = process.wait(timeout=30)
        took = time.monotonic() - began
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    said = "".join(_drain(output))
    left = _left_behind(docker_client, process.pid, folder)
    assert (status, left) == (0, []) and took < 30, (
        f"exit status {status} after {took:.1f} s, left {left}; it said:\n{said}"
    )


def test_a_missing_binary_fails_with_the_command_to_run(tmp_path, monkeypatch):
    """Without the built binary the fixture fails (never skips) and says what builds it."""
    monkeypatch.setattr(cluster, "APISERVER", tmp_path / "kube-apiserver")
    with pytest.raises(cluster.ClusterMissing, match=r"run \./dev test"), cluster.start_cluster(tmp_path / "state"):
        pass


def _events(core: client.CoreV1Api, namespace: str, resource_version: str, count: int) -> list[tuple[str, str]]:
    """The first `count` watch events from `resource_version`, as (type, Pod name)."""
    seen = []
    stream = watch.Watch()
    for event in stream.stream(
        core.list_namespaced_pod, namespace, resource_version=resource_version, timeout_seconds=30
    ):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == count:
            stream.stop()
    return seen


def _eventually_allowed(call, within: float = 15.0) -> int:
    """The call's status once the RBAC authorizer's informer has seen a new binding (it lags the write by
    up to a second or so under load), or the last status after `within` seconds."""
    deadline = time.monotonic() + within
    while (status := _status(call)) == 403 and time.monotonic() < deadline:
        time.sleep(0.2)
    return status


def _status(call) -> int:
    try:
        call()
    except ApiException as exc:
        return exc.status
    return 200


def _get(kube, path: str, user_agent: str = "orchard-test") -> tuple[int, str]:
    """(status, body) of a GET as the admin, asking for JSON."""
    headers = {"Authorization": f"Bearer {kube.token}", "Accept": "application/json", "User-Agent": user_agent}
    context = ssl.create_default_context(cafile=str(kube.ca_file))
    with urllib.request.urlopen(
        urllib.request.Request(kube.url + path, headers=headers), context=context, timeout=30
    ) as answer:
        return answer.status, answer.read().decode()


def _crash_lines(kube) -> str:
    """The API server log's lines from its Go crash on (the fault and its first frames), or its end."""
    lines = (kube.folder / "kube-apiserver.log").read_text(errors="replace").splitlines()
    fault = next((i for i, line in enumerate(lines) if "SIGSEGV" in line or line.startswith("panic")), None)
    return "\n".join(lines[fault - 2 : fault + 20] if fault is not None else lines[-30:])


def _ready_folder(output: queue.Queue, deadline: float) -> Path:
    """The state folder cluster.py says it uses, once it says it is ready (its kubeconfig line)."""
    said = []
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = output.get(timeout=remaining)
        except queue.Empty:
            break
        if line is None:
            break
        said.append(line)
        if line.startswith("kubeconfig: "):
            return Path(line.removeprefix("kubeconfig: ").strip()).parent
    pytest.fail("cluster.py did not say it was ready:\n" + "".join(said))


def _read_lines(stream, output: queue.Queue) -> None:
    """Each line of `stream` into `output`, then None at its end."""
    for line in stream:
        output.put(line)
    output.put(None)


def _drain(output: queue.Queue) -> list[str]:
    """What is left in `output` up to its end (None), waiting at most 5 s for each line."""
    lines = []
    with contextlib.suppress(queue.Empty):
        while (line := output.get(timeout=5)) is not None:
            lines.append(line)
    return lines


def _pids(marker: str) -> list[int]:
    """Live processes (not zombies: their command line reads empty) whose command line has `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
    return found


def _left_behind(docker_client, pid: int, folder: Path) -> list[str]:
    """What cluster.py run as process `pid` with state in `folder` left: its servers, its test kubelet's
    Docker objects (labelled with the pid, the network named after it), the folder, etcd's data."""
    label = {"label": f"orchard.test-kubelet/pid={pid}"}
    networks = [n for n in docker_client.networks.list() if n.name.startswith(f"orchard-kubelet-{pid}-")]
    etcd_data = [
        path for root in ("/dev/shm", tempfile.gettempdir()) for path in Path(root).glob(f"orchard-etcd-{pid}-*")
    ]
    return [
        *(f"process {found}" for found in _pids(f"--cert-dir={folder}") + _pids(f"orchard-etcd-{pid}-")),
        *(f"network {network.name}" for network in networks),
        *(f"container {c.name}" for c in docker_client.containers.list(all=True, filters=label, ignore_removed=True)),
        *(f"volume {volume.name}" for volume in docker_client.volumes.list(filters=label)),
        *(str(path) for path in [folder, *etcd_data] if path.exists()),
    ]


def _wait_until(condition, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)

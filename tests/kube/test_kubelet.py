"""The test kubelet (tests/kube/kubelet.py) against the real API server of the `kube` fixture.

Each claim of its docstring that the Kubernetes backend's tests lean on is attacked here with real
Pods: an init container fills an emptyDir that the main container serves at its podIP; a missing
image is ErrImagePull and stays Pending; a graceful delete removes the containers and the Pod; a
killed container fails the Pod; a Pod that no node suits is Unschedulable; the watch survives an
API server restart; status-only mode makes 100 Pods Ready fast.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from kubelet import ApiError, TestKubelet, _Api, _expand, pod_path

IMAGE = "orchard/base:bookworm"


def _pod(name: str, containers: list[dict], **spec: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": containers, "restartPolicy": "Never", **spec},
    }


def _create(api: _Api, namespace: str, pod: dict) -> dict:
    return api.call("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)


def _read(api: _Api, namespace: str, name: str) -> dict | None:
    try:
        return api.call("GET", pod_path(namespace, name))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _condition(pod: dict | None, kind: str) -> dict:
    return next((c for c in (pod or {}).get("status", {}).get("conditions") or [] if c["type"] == kind), {})


def _ready(api: _Api, namespace: str, name: str) -> Callable[[], dict | None]:
    def check() -> dict | None:
        pod = _read(api, namespace, name)
        return pod if _condition(pod, "Ready").get("status") == "True" else None

    return check


def _served_pod(name: str) -> dict:
    """A Pod whose init container writes a page into an emptyDir that the main container serves on 7000."""
    mount = {"name": "site", "mountPath": "/site"}
    return _pod(
        name,
        initContainers=[
            {
                "name": "writer",
                "image": IMAGE,
                "command": ["sh", "-c", 'echo "hello from $(POD_NAME)" > /site/index.html'],
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "volumeMounts": [mount],
            }
        ],
        containers=[
            {
                "name": "server",
                "image": IMAGE,
                "command": ["python3", "-m", "http.server", "7000"],
                "workingDir": "/site",
                "ports": [{"containerPort": 7000, "name": "http"}],
                "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1},
                "volumeMounts": [{**mount, "readOnly": True}],
                "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": True,
                },
            }
        ],
        volumes=[{"name": "site", "emptyDir": {}}],
        terminationGracePeriodSeconds=5,
    )


def test_expand_is_kubernetes_variable_expansion():
    env = {"A": "1", "B": "two"}
    assert _expand("$(A)-$(B)-$(C)-$$(A)-$$$(A)", env) == "1-two-$(C)-$(A)-$1"


def test_init_container_fills_an_empty_dir_that_the_pod_serves_at_its_pod_ip(api, namespace, kubelet, docker_client):
    started = time.monotonic()
    _create(api, namespace, _served_pod("web"))
    pod = _wait("the Pod to be Ready", _ready(api, namespace, "web"))
    ready_after = time.monotonic() - started

    status = pod["status"]
    address = status["podIP"]
    assert address.startswith("127.0.") and address != "127.0.0.1"
    assert status["podIPs"] == [{"ip": address}] and status["phase"] == "Running" and status["startTime"]
    assert pod["spec"]["nodeName"] == kubelet.node_name
    with urllib.request.urlopen(f"http://{address}:7000/index.html", timeout=5) as answer:
        assert answer.read() == b"hello from web\n"

    (init,) = status["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0 and init["state"]["terminated"]["reason"] == "Completed"
    (main,) = status["containerStatuses"]
    assert main["ready"] and main["started"] and main["state"]["running"]["startedAt"]
    assert main["imageID"].startswith("docker://sha256:") and main["containerID"].startswith("docker://")
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }

    server = docker_client.containers.get(main["containerID"].removeprefix("docker://"))
    host = server.attrs["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges:true" in host["SecurityOpt"]
    assert host["ReadonlyRootfs"] and host["NanoCpus"] == 500_000_000 and host["Memory"] == 128 * 2**20
    assert [m["RW"] for m in server.attrs["Mounts"]] == [False]
    print(f"init + main container Ready in {ready_after:.2f}s")


def test_a_killed_container_fails_the_pod(api, namespace, kubelet):
    _create(api, namespace, _served_pod("victim"))
    _wait("the Pod to be Ready", _ready(api, namespace, "victim"))
    kubelet.kill("victim")
    pod = _wait(
        "the Pod to fail", lambda: (p := _read(api, namespace, "victim")) and p["status"]["phase"] == "Failed" and p
    )
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 137 and terminated["reason"] == "Error"
    assert _condition(pod, "Ready")["status"] == "False"


def test_an_oom_killed_container_says_oomkilled(api, namespace, kubelet):
    hog = {
        "name": "hog",
        "image": IMAGE,
        "command": ["python3", "-c", "x = bytearray(256 * 2**20); import time; time.sleep(60)"],
        "resources": {"limits": {"memory": "32Mi"}},
    }
    _create(api, namespace, _pod("hog", [hog]))
    pod = _wait(
        "the Pod to fail", lambda: (p := _read(api, namespace, "hog")) and p["status"]["phase"] == "Failed" and p
    )
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "OOMKilled"


def test_a_missing_image_is_err_image_pull_and_the_pod_stays_pending(api, namespace, kubelet):
    missing = "orchard/not-built-here:0"
    _create(api, namespace, _pod("nowhere", [{"name": "main", "image": missing}]))

    def waiting() -> dict | None:
        pod = _read(api, namespace, "nowhere")
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
        return statuses[0].get("state", {}).get("waiting", {}).get("reason") == "ErrImagePull" and pod

    pod = _wait("ErrImagePull", waiting, timeout=30)
    assert missing in pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    time.sleep(3)  # past the first backoff: looked for again, still missing, still Pending
    pod = _read(api, namespace, "nowhere")
    assert pod["status"]["phase"] == "Pending"
    assert kubelet.containers("nowhere") == []


def test_a_graceful_delete_removes_the_containers_then_the_pod(api, namespace, kubelet):
    """Slow: the Pod's grace period is waited out for real."""
    _create(api, namespace, _served_pod("doomed"))
    pod = _wait("the Pod to be Ready", _ready(api, namespace, "doomed"))
    assert len(kubelet.containers("doomed")) == 2  # the init container and the server
    address = pod["status"]["podIP"]

    started = time.monotonic()
    api.call("DELETE", pod_path(namespace, "doomed"), body={"gracePeriodSeconds": 5})
    _wait("the Pod to be gone", lambda: _read(api, namespace, "doomed") is None, timeout=30)
    gone_after = time.monotonic() - started
    assert kubelet.containers("doomed") == [] and kubelet.leftovers() == []
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{address}:7000/", timeout=2)
    print(f"graceful delete done in {gone_after:.2f}s")


def test_a_pod_no_node_suits_is_unschedulable(api, namespace, kubelet):
    _create(api, namespace, _pod("picky", [{"name": "main", "image": IMAGE}], nodeSelector={"disktype": "ssd"}))
    pod = _wait("Unschedulable", lambda: _condition(p := _read(api, namespace, "picky"), "PodScheduled") and p)
    assert _condition(pod, "PodScheduled") | {"lastTransitionTime": None} == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 node(s) didn't match node selector.",
        "lastProbeTime": None,
        "lastTransitionTime": None,
    }
    assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"


def test_status_only_makes_100_pods_ready_and_deletes_them(kube, api, namespace):
    names = [f"sandbox-{index}" for index in range(100)]
    with TestKubelet(kube.client(), namespace=namespace, node_name=f"fake-{namespace}", mode="status-only") as kubelet:
        started = time.monotonic()
        _in_threads(lambda name: _create(api, namespace, _pod(name, [{"name": "main", "image": "any"}])), names)

        def all_ready() -> list | None:
            pods = api.call("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
            ready = [p for p in pods if _condition(p, "Ready").get("status") == "True"]
            return ready if len(ready) == len(names) else None

        pods = _wait("100 Pods Ready", all_ready, timeout=60)
        ready_after = time.monotonic() - started
        addresses = {p["status"]["podIP"] for p in pods}
        assert len(addresses) == 100 and all(a.startswith("127.1.") for a in addresses)

        _in_threads(lambda name: api.call("DELETE", pod_path(namespace, name)), names)
        _wait("every Pod gone", lambda: not api.call("GET", f"/api/v1/namespaces/{namespace}/pods")["items"], 60)
        done_after = time.monotonic() - started
        assert kubelet.errors == [] and kubelet.stats["binds"] == 100  # a delete may find its Pod gone already
    print(f"100 Pods: Ready after {ready_after:.2f}s, deleted after {done_after:.2f}s")  # a figure, not a test


def test_the_watch_survives_an_api_server_restart(kube, api, namespace):
    """The restarted API server's watch cache starts past the kubelet's resourceVersion (a ConfigMap
    was written since): its watch gets 410 Gone, it relists, and Pods created then are run and deleted.

    Slow: it stops and restarts the real kube-apiserver, which takes seconds to serve again.
    """
    with TestKubelet(kube.client(), namespace=namespace, node_name=f"fake-{namespace}", mode="status-only") as kubelet:
        _create(api, namespace, _pod("before", [{"name": "main", "image": "any"}]))
        _wait("the first Pod Ready", _ready(api, namespace, "before"))
        api.call("POST", f"/api/v1/namespaces/{namespace}/configmaps", body={"metadata": {"name": "later"}})
        relists = kubelet.stats["relists"]
        began = time.monotonic()
        kube.restart()
        restarted_after = time.monotonic() - began
        began = time.monotonic()
        _create(api, namespace, _pod("after", [{"name": "main", "image": "any"}]))
        _wait("a Pod created after the restart Ready", _ready(api, namespace, "after"), timeout=60)
        ready_after = time.monotonic() - began
        assert kubelet.stats["relists"] > relists
        api.call("DELETE", pod_path(namespace, "before"), body={"gracePeriodSeconds": 30})
        _wait("the deleted Pod gone", lambda: _read(api, namespace, "before") is None, timeout=30)
        assert kubelet.errors == []
    print(f"API server restarted in {restarted_after:.2f}s; a new Pod Ready {ready_after:.2f}s after")


def _in_threads(work: Callable[[str], Any], names: list[str], threads: int = 8) -> None:
    """Run `work(name)` for every name on a few threads; the first failure is raised."""
    pending, failures = list(names), []
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                if not pending:
                    return
                name = pending.pop()
            try:
                work(name)
            except Exception as exc:
                failures.append(exc)

    workers = [threading.Thread(target=drain) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]

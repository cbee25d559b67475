"""The service image (`orchard image build-service`, built from this checkout) run as the Deployment's
Pod on the test cluster, and reached with Orchard's SDK: a sandbox is created, runs a command, has a
file written and read, and is deleted, its Pod gone.

The manifests of deploy/kubernetes/ are applied to the session's API server in namespaces of their
own (`test_manifests._renamed`): the namespaces, the service account and its Role, the Service,
the policies and the Deployment. No controller manager runs here, so the test makes the one Pod a
ReplicaSet would make, from the stored Deployment's Pod template (the API server's defaults filled
in), and a test kubelet per namespace runs it and the sandbox Pods with Docker
(tests/kube/kubelet.py says what it emulates). The Secret `orchard` holds a fresh API key and the
store's URL, as README.md tells a lab to create it.

What the Deployment applied here changes from deployment.yaml, and why:
* `replicas: 1`: one replica shows the image serves; test_fleet.py runs several.
* `hostNetwork: true`: the test kubelet has no Pod network. The service must reach the API server
  (on this host's loopback) and the sandboxes' agents (127.0.0.N:7000, published on this host's
  loopback); from the host's network namespace it reaches both, as a Pod reaches them over a CNI.
* `--host 127.0.0.1 --port <a free port>` (and the containerPort with it), not `0.0.0.0:8765`: on
  the host's network a fixed port may be taken, and 0.0.0.0 would open the service beyond this
  machine.
* `--namespace`: the renamed sandbox namespace, as the RoleBinding is renamed.
* The store: the session's PostgreSQL listens on a Unix socket only (no TCP port), so its folder is
  mounted into the Pod (a hostPath volume at /var/run/postgresql) and the Secret's `db-url` names
  that folder; a cluster's replicas reach their PostgreSQL over the network.
Everything else is the manifest's: the image and `--agent-image` tags, command and args, the
service account (its token projected by the kubelet, `KUBERNETES_SERVICE_*` naming the API server,
so the backend configures itself in-cluster with no kubeconfig), the env from the Secret, non-root
uid 10001 with a read-only root and no capabilities, the emptyDir volumes and the httpGet probes.
"""

from __future__ import annotations

import copy
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from urllib.parse import urlsplit

import pytest
from kubelet import TestKubelet, _Api, pod_path
from test_manifests import SANDBOX_NS, SERVICE_NS, _apply, _documents, _fresh_names, _namespaces_first, _renamed

from orchard.deploy import build_service, service_tag
from orchard.env import images

SANDBOX_LABEL = "orchard.sandbox/id"


@pytest.fixture(scope="module")
def service_image(docker_client) -> str:
    """The service image of this checkout (built once; reused while the wheel is the same)."""
    return build_service()


@pytest.fixture(scope="module")
def agent_image(docker_client) -> str:
    return images.build_agent()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _as_tested(docs: list[dict], port: int, sandboxes: str, socket_folder: str) -> list[dict]:
    """The renamed manifests with the Deployment changed as the module docstring says."""
    docs = copy.deepcopy(docs)
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    deployment["spec"]["replicas"] = 1
    pod = deployment["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    pod["volumes"].append({"name": "postgres", "hostPath": {"path": socket_folder, "type": "Directory"}})
    (container,) = pod["containers"]
    args = container["args"]
    args[args.index("--host") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(port)
    args[args.index("--namespace") + 1] = sandboxes
    container["ports"] = [{"name": "http", "containerPort": port}]
    container["volumeMounts"].append({"name": "postgres", "mountPath": "/var/run/postgresql"})
    return docs


def _wait_ready(api: _Api, namespace: str, name: str, kubelet: TestKubelet, timeout: float = 120) -> dict:
    """The Pod once its Ready condition is True; on timeout, its status and container logs in the failure."""
    deadline = time.monotonic() + timeout
    while True:
        pod = api.call("GET", pod_path(namespace, name))
        ready = [c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == "Ready"]
        if ready and ready[0]["status"] == "True":
            return pod
        if time.monotonic() > deadline:
            logs = [c.logs(tail=30).decode(errors="replace") for c in kubelet.containers(name, namespace)]
            pytest.fail(f"the service Pod is not Ready: {pod.get('status')}\n{''.join(logs)}")
        time.sleep(0.2)


def _wait_waiting(api: _Api, namespace: str, name: str, timeout: float = 60) -> dict:
    """The `waiting` state of the Pod's container once it is not ContainerCreating."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = api.call("GET", pod_path(namespace, name)).get("status", {}).get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        if waiting.get("reason") not in (None, "ContainerCreating"):
            return waiting
        time.sleep(0.1)
    pytest.fail(f"the Pod {name} did not wait for anything in {timeout:.0f} s")


def _sandbox_pods(api: _Api, namespace: str, sandbox_id: str) -> list[dict]:
    query = {"labelSelector": f"{SANDBOX_LABEL}={sandbox_id}"}
    return api.call("GET", f"/api/v1/namespaces/{namespace}/pods", query=query)["items"]


@pytest.fixture
def cluster(kube, docker_client) -> Iterator[tuple[_Api, dict[str, str], dict[str, TestKubelet]]]:
    """The admin's API, the namespaces' new names, and a running test kubelet for each namespace."""
    names = _fresh_names()
    api = _Api(kube.client())
    for doc in _namespaces_first(_renamed([d for d in _documents() if d["kind"] == "Namespace"], names)):
        _apply(api, doc, dry_run=False)
    with ExitStack() as stack:
        kubelets = {
            name: stack.enter_context(
                TestKubelet(kube.client(), docker_client, namespace=names[name], node_name=f"node-{names[name]}")
            )
            for name in (SERVICE_NS, SANDBOX_NS)
        }
        yield api, names, kubelets
        for kubelet in kubelets.values():
            assert kubelet.errors == []


def test_the_service_image_runs_as_the_deployment_and_serves_the_sdk(
    cluster, service_image, agent_image, base_image, postgres_url
) -> None:
    """The install order README.md gives: the Pod waits for its Secret (CreateContainerConfigError), then
    starts by itself and turns Ready; the SDK then works through it.

    Slow: on a loaded machine: the service Pod starts `orchard up` (its imports, the store's tables)
    and a sandbox Pod starts from the agent image (about 10 s alone on two cores)."""
    from orchard.env import Client

    api, names, kubelets = cluster
    documents = _documents()
    (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == service_image == service_tag()
    assert container["args"][container["args"].index("--agent-image") + 1] == agent_image

    database = urlsplit(postgres_url)
    socket_folder = dict(part.split("=", 1) for part in database.query.split("&"))["host"]
    port, key = _free_port(), secrets.token_urlsafe(24)
    service, sandboxes = names[SERVICE_NS], names[SANDBOX_NS]
    for doc in _namespaces_first(_renamed(_as_tested(documents, port, sandboxes, socket_folder), names)):
        if doc["kind"] != "Namespace":
            _apply(api, doc, dry_run=False)
    stored = api.call("GET", f"/apis/apps/v1/namespaces/{service}/deployments/orchard")
    template = stored["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": "orchard-0", "namespace": service},
        "spec": template["spec"],
    }
    api.call("POST", f"/api/v1/namespaces/{service}/pods", body=pod)
    waiting = _wait_waiting(api, service, "orchard-0")  # README.md: it waits for the Secret, then starts
    assert waiting == {"reason": "CreateContainerConfigError", "message": 'test kubelet: secret "orchard" not found'}
    db_url = f"postgresql+psycopg://orchard@{database.path}?host=/var/run/postgresql"
    secret = {"metadata": {"name": "orchard"}, "stringData": {"db-url": db_url, "api-key": key}}
    api.call("POST", f"/api/v1/namespaces/{service}/secrets", body={"apiVersion": "v1", "kind": "Secret", **secret})
    running = _wait_ready(api, service, "orchard-0", kubelets[SERVICE_NS])
    (box_container,) = kubelets[SERVICE_NS].containers("orchard-0", service)
    assert box_container.attrs["Config"]["User"] == "10001:10001"
    started = box_container.logs().decode(errors="replace")
    assert "not ours to change" not in started, started  # ORCHARD_HOME is a folder it makes private
    assert running["status"]["podIP"] == "127.0.0.1"

    with Client(url=f"http://127.0.0.1:{port}", api_key=key) as client:
        box = client.create(base_image, timeout=120)
        (sandbox_pod,) = _sandbox_pods(api, sandboxes, box.id)
        assert sandbox_pod["spec"]["nodeName"] == f"node-{sandboxes}"
        result = box.exec("echo hello from $(hostname); id -u")
        assert result.exit_code == 0 and result.stdout.startswith("hello from "), result
        assert box.write_file("/tmp/note.txt", "written through the service\n") > 0
        assert box.read_file("/tmp/note.txt") == b"written through the service\n"
        assert box.exec("cat /tmp/note.txt").stdout == "written through the service\n"
        box.delete()
    deadline = time.monotonic() + 60
    while _sandbox_pods(api, sandboxes, box.id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _sandbox_pods(api, sandboxes, box.id) == []
    assert not [c for c in kubelets[SANDBOX_NS].leftovers() if sandbox_pod["metadata"]["name"] in c]


def test_the_deployment_applied_differs_from_the_manifest_only_where_the_docstring_says() -> None:
    """The Deployment applied above differs from deployment.yaml in the fields the module docstring
    lists, and in no other."""
    documents = _documents()
    changed = _as_tested(documents, 31337, "elsewhere", "/tmp/pg")
    (before,) = [doc for doc in documents if doc["kind"] == "Deployment"]
    (after,) = [doc for doc in changed if doc["kind"] == "Deployment"]
    assert [doc for doc in documents if doc["kind"] != "Deployment"] == [
        doc for doc in changed if doc["kind"] != "Deployment"
    ]
    pod_before, pod_after = before["spec"]["template"]["spec"], after["spec"]["template"]["spec"]
    (container_before,), (container_after,) = pod_before["containers"], pod_after["containers"]
    differing = {key for key in container_before if container_before[key] != container_after.get(key)}
    assert differing == {"args", "ports", "volumeMounts"}
    args_before, args_after = container_before["args"], container_after["args"]
    assert [(a, b) for a, b in zip(args_before, args_after, strict=True) if a != b] == [
        ("orchard-sandboxes", "elsewhere"),
        ("0.0.0.0", "127.0.0.1"),
        ("8765", "31337"),
    ]
    assert {key for key in pod_after if pod_before.get(key) != pod_after[key]} == {
        "containers",
        "hostNetwork",
        "volumes",
    }
    assert after["spec"]["replicas"] == 1 and {**after["spec"], "replicas": 3, "template": None} == {
        **before["spec"],
        "template": None,
    }

"""The test API server is a real one: it validates, dry-runs, authorizes, serves list+watch (410 Gone
after its own restart, as a real one), and keeps a bound Pod a kubelet must finish deleting."""

from __future__ import annotations

import time

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

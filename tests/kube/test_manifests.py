"""The manifests a lab applies (`deploy/kubernetes/`): they parse, `kubectl apply -k` takes them all,
and they say what the README claims: the least RBAC rights, the service's shape, the sandboxes'
network policies, and names that agree across files (the labels a policy or Service selects are
the labels the Deployment gives its Pods). Then against the real API server (`kube`): every object
passes a server-side dry run with no field dropped, and, applied, the service's own token may do
what the sandboxes need and nothing more. (That NetworkPolicies are enforced needs a CNI: not here.)"""

from __future__ import annotations

import copy
import secrets
from pathlib import Path

import pytest
import yaml
from kubelet import ApiError, _Api

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
SERVICE_NS, SANDBOX_NS = "orchard", "orchard-sandboxes"
LEAST_RIGHTS = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["create", "get", "list", "patch", "delete"],
    },
]


def _documents() -> list[dict]:
    """Every object of every manifest file, parsed as `kubectl` would (empty documents dropped)."""
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        with open(path) as f:
            found += [doc for doc in yaml.safe_load_all(f) if doc is not None]
    return found


def _one(kind: str, name: str | None = None) -> dict:
    matches = [d for d in _documents() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def _selects(selector: dict, labels: dict) -> bool:
    """Whether a `matchLabels` selector (the only form these manifests use) selects `labels`."""
    assert set(selector) <= {"matchLabels"}
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_kustomization_applies_every_file_and_only_those() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    files = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert not (DEPLOY / "kustomization.yml").exists()


def test_every_object_is_namespaced_where_it_should_be() -> None:
    kinds = sorted((d["kind"], d["metadata"].get("namespace", "")) for d in _documents())
    assert kinds == sorted(
        [
            ("Namespace", ""),
            ("Namespace", ""),
            ("ServiceAccount", SERVICE_NS),
            ("Role", SANDBOX_NS),
            ("RoleBinding", SANDBOX_NS),
            ("Deployment", SERVICE_NS),
            ("Service", SERVICE_NS),
            ("NetworkPolicy", SANDBOX_NS),
            ("NetworkPolicy", SANDBOX_NS),
            ("NetworkPolicy", SANDBOX_NS),
        ]
    )
    assert {d["metadata"]["name"] for d in _documents() if d["kind"] == "Namespace"} == {SERVICE_NS, SANDBOX_NS}


def test_rbac_grants_exactly_the_least_rights_in_the_sandbox_namespace_only() -> None:
    """Pods create/get/list/watch/delete and pods/status get, in orchard-sandboxes; nothing else,
    nothing cluster-wide (no ClusterRole, no ClusterRoleBinding, no wildcard)."""
    assert not [d for d in _documents() if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role = _one("Role")
    assert role["rules"] == LEAST_RIGHTS
    binding = _one("RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    account = _one("ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": SERVICE_NS}
    ]
    pod = _one("Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_the_deployment_runs_the_service_on_kubernetes_as_three_hardened_replicas() -> None:
    deployment = _one("Deployment", "orchard")
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    template = spec["template"]
    assert _selects(spec["selector"], template["metadata"]["labels"])
    assert template["metadata"]["labels"]["app"] == "orchard"
    pod = template["spec"]
    (container,) = pod["containers"]
    argv = [*container["command"], *container["args"]]
    assert argv[:4] == ["orchard", "up", "--backend", "kubernetes"] and "--foreground" in argv
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and argv[argv.index("--port") + 1] == "8765"
    assert argv[argv.index("--fleet") + 1] == "orchard"  # one fleet: the sandboxes outlive any replica
    assert container["image"].startswith("orchard/orchard:")
    assert container["ports"] == [{"name": "http", "containerPort": 8765}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
    assert secrets == {"ORCHARD_DB_URL": "orchard", "ORCHARD_API_KEY": "orchard"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # a read-only root: every folder the service writes is a volume
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    for folder in (env["HOME"], env["ORCHARD_HOME"], env["ORCHARD_CACHE_DIR"], env["ORCHARD_RUN_DIR"]):
        assert any(folder == m or folder.startswith(m + "/") for m in mounts), folder


def test_the_service_reaches_the_replicas() -> None:
    service = _one("Service", "orchard")
    assert service["spec"]["type"] == "ClusterIP"
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert service["spec"]["ports"] == [{"name": "http", "port": 8765, "targetPort": "http", "protocol": "TCP"}]


def _policy(name: str) -> dict:
    policy = _one("NetworkPolicy", name)
    assert policy["metadata"]["namespace"] == SANDBOX_NS
    return policy["spec"]


SANDBOX = {"app.kubernetes.io/managed-by": "orchard", "orchard.sandbox/id": "x"}
"""The labels of a sandbox Pod (`blocked`, unless `orchard.sandbox/network` says otherwise)."""


def test_every_sandbox_pod_is_denied_all_traffic_by_default() -> None:
    spec = _policy("default-deny")
    assert spec == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_only_the_service_pods_reach_the_agent_port() -> None:
    spec = _policy("agent-from-orchard")
    assert _selects(spec["podSelector"], SANDBOX) and spec["policyTypes"] == ["Ingress"]
    assert "egress" not in spec
    ((rule),) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 7000}]
    ((source),) = rule["from"]  # one entry holding both selectors: Pods labelled so in that namespace
    namespace = _one("Namespace", SERVICE_NS)["metadata"]["labels"]
    service_pods = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert source["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": SERVICE_NS}}
    assert _selects(source["namespaceSelector"], namespace)
    assert source["podSelector"] == {"matchLabels": {"app": "orchard"}} and _selects(
        source["podSelector"], service_pods
    )


def test_open_sandboxes_reach_the_internet_and_dns_but_not_private_or_metadata_addresses() -> None:
    spec = _policy("open-egress")
    assert not _selects(spec["podSelector"], SANDBOX)
    assert not _selects(spec["podSelector"], {**SANDBOX, "orchard.sandbox/network": "dropped"})
    assert _selects(spec["podSelector"], {**SANDBOX, "orchard.sandbox/network": "open"})
    assert spec["policyTypes"] == ["Egress"] and "ingress" not in spec
    internet, dns = spec["egress"]
    ((block),) = internet["to"]
    assert "ports" not in internet
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(block["ipBlock"]["except"])
    ((resolver),) = dns["to"]
    assert resolver == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    assert sorted((p["protocol"], p["port"]) for p in dns["ports"]) == [("TCP", 53), ("UDP", 53)]


@pytest.mark.parametrize("network", ["blocked", "dropped"])
def test_a_sandbox_that_is_not_open_gets_no_egress_rule(network: str) -> None:
    labels = {**SANDBOX, "orchard.sandbox/network": network}
    egress = [d for d in _documents() if d["kind"] == "NetworkPolicy" and "Egress" in d["spec"]["policyTypes"]]
    allowing = [
        d["metadata"]["name"] for d in egress if _selects(d["spec"]["podSelector"], labels) and d["spec"].get("egress")
    ]
    assert allowing == []


# -- against the real API server (the `kube` fixture) -------------------------------------------

PATHS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
}
NAME_LABEL = "kubernetes.io/metadata.name"


def _renamed(docs: list[dict], names: dict[str, str]) -> list[dict]:
    """The manifests with their two namespaces renamed wherever a namespace is named (the objects'
    namespace, the Namespaces and their name label, RoleBinding subjects, policies' namespace
    selectors), so one session's API server can hold them beside other tests' `orchard-sandboxes`."""
    out = copy.deepcopy(docs)
    for doc in out:
        meta = doc["metadata"]
        if doc["kind"] == "Namespace":
            meta["name"] = names[meta["name"]]
            meta["labels"][NAME_LABEL] = meta["name"]
        elif meta.get("namespace") in names:
            meta["namespace"] = names[meta["namespace"]]
        for subject in doc.get("subjects", []):
            subject["namespace"] = names.get(subject["namespace"], subject["namespace"])
        for rule in doc.get("spec", {}).get("ingress", []) + doc.get("spec", {}).get("egress", []):
            for peer in rule.get("from", []) + rule.get("to", []):
                labels = peer.get("namespaceSelector", {}).get("matchLabels", {})
                if labels.get(NAME_LABEL) in names:
                    labels[NAME_LABEL] = names[labels[NAME_LABEL]]
    return out


def _dropped(sent: object, stored: object, where: str = "") -> list[str]:
    """Paths of fields in `sent` that the server's answer lacks: fields it does not know (1.20 drops
    unknown fields where newer servers reject them) or misplaced ones."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [where or "/"]
        return [
            p
            for k, v in sent.items()
            for p in (_dropped(v, stored[k], f"{where}.{k}") if k in stored else [f"{where}.{k}"])
        ]
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(stored) != len(sent):
            return [where]
        return [p for i, v in enumerate(sent) for p in _dropped(v, stored[i], f"{where}[{i}]")]
    return []


def _apply(api, doc: dict, *, dry_run: bool) -> dict:
    path = PATHS[doc["kind"]].format(ns=doc["metadata"].get("namespace", ""))
    return api.call("POST", path, body=doc, query={"dryRun": "All"} if dry_run else None)


def _fresh_names() -> dict[str, str]:
    """New names for the two namespaces, unique in the session's API server."""
    prefix = f"m{secrets.token_hex(3)}"
    return {SERVICE_NS: f"{prefix}-{SERVICE_NS}", SANDBOX_NS: f"{prefix}-{SANDBOX_NS}"}


def _namespaces_first(docs: list[dict]) -> list[dict]:
    """The server only takes (or dry-runs) an object in a namespace that exists."""
    return sorted(docs, key=lambda d: d["kind"] != "Namespace")


def test_every_manifest_passes_a_server_side_dry_run(kube) -> None:
    """The server validates each object in full (schemas, enum values, references) and keeps every
    field we sent. The namespaces are created for real, the rest only dry-run inside them."""
    api = _Api(kube.client())
    for doc in _namespaces_first(_renamed(_documents(), _fresh_names())):
        checked = _apply(api, doc, dry_run=True)
        assert _dropped(doc, checked) == [], f"{doc['kind']} {doc['metadata']['name']}"
        if doc["kind"] == "Namespace":
            _apply(api, doc, dry_run=False)


@pytest.fixture(scope="module")
def installed(kube) -> dict[str, str]:
    """The manifests applied for real, in namespaces of their own; returns the namespaces' names."""
    api = _Api(kube.client())
    names = _fresh_names()
    for doc in _namespaces_first(_renamed(_documents(), names)):
        _apply(api, doc, dry_run=False)
    return names


def test_a_dry_run_catches_what_the_manifest_test_relies_on(kube) -> None:
    """The check above can fail: a misspelt field is dropped (1.20) and a wrong enum value refused."""
    api = _Api(kube.client())
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
    policy = {**_one("NetworkPolicy", "default-deny"), "metadata": {"name": "x", "namespace": "default"}}
    misspelt = {**policy, "spec": {**policy["spec"], "podSelecter": {}}}
    assert _dropped(misspelt, _apply(api, misspelt, dry_run=True)) == [".spec.podSelecter"]
    assert _dropped(namespace, _apply(api, namespace, dry_run=True)) == []
    wrong = {**policy, "spec": {**policy["spec"], "policyTypes": ["Inbound"]}}
    with pytest.raises(ApiError) as refused:
        _apply(api, wrong, dry_run=True)
    assert refused.value.status == 422


def _as_service(kube, installed: dict[str, str]):
    """An API client holding a token of the service's ServiceAccount (TokenRequest), as a replica's is."""
    from kubernetes import client

    with kube.client() as admin:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
        )
        account = _one("ServiceAccount")["metadata"]["name"]
        token = client.CoreV1Api(admin).create_namespaced_service_account_token(account, installed[SERVICE_NS], request)
    return kube.client(token.status.token)


def test_the_service_account_may_run_sandbox_pods_and_nothing_else(kube, installed) -> None:
    """With the service's own token: Pods in the sandbox namespace can be created, read, listed,
    watched and deleted, and owners' Leases there written; anything else (another namespace,
    Secrets, changing a Pod, exec, logs, cluster-wide lists) is forbidden."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    sandboxes, service = installed[SANDBOX_NS], installed[SERVICE_NS]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rbac-check", "labels": {"app.kubernetes.io/managed-by": "orchard"}},
        "spec": {"containers": [{"name": "sandbox", "image": "busybox"}], "restartPolicy": "Never"},
    }
    lease = {"metadata": {"name": "rbac-check"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 40}}

    def status(call) -> int:
        try:
            call()
        except ApiException as exc:
            return exc.status
        return 200

    with _as_service(kube, installed) as api:
        core, leases = client.CoreV1Api(api), client.CoordinationV1Api(api)
        allowed = [
            status(lambda: core.create_namespaced_pod(sandboxes, pod)),
            status(lambda: core.read_namespaced_pod("rbac-check", sandboxes)),
            status(lambda: core.read_namespaced_pod_status("rbac-check", sandboxes)),
            status(lambda: core.list_namespaced_pod(sandboxes)),
            status(lambda: core.list_namespaced_pod(sandboxes, watch=True, timeout_seconds=1, _preload_content=False)),
            status(lambda: core.delete_namespaced_pod("rbac-check", sandboxes, grace_period_seconds=0)),
            status(lambda: leases.create_namespaced_lease(sandboxes, lease)),
            status(lambda: leases.read_namespaced_lease("rbac-check", sandboxes)),
            status(lambda: leases.patch_namespaced_lease("rbac-check", sandboxes, {"spec": {"holderIdentity": "me"}})),
            status(lambda: leases.list_namespaced_lease(sandboxes)),
            status(lambda: leases.delete_namespaced_lease("rbac-check", sandboxes)),
        ]
        denied = [
            status(lambda: core.create_namespaced_pod(service, pod)),
            status(lambda: core.list_namespaced_pod(service)),
            status(lambda: core.list_pod_for_all_namespaces()),
            status(lambda: core.list_namespaced_secret(sandboxes)),
            status(lambda: core.list_namespaced_secret(service)),
            status(lambda: core.patch_namespaced_pod("any", sandboxes, {"metadata": {"labels": {"a": "b"}}})),
            status(lambda: core.delete_collection_namespaced_pod(sandboxes)),
            status(lambda: core.read_namespaced_pod_log("any", sandboxes)),
            status(lambda: core.connect_post_namespaced_pod_exec("any", sandboxes, command=["true"])),
            status(lambda: core.list_namespace()),
            status(lambda: leases.create_namespaced_lease(service, lease)),
            status(lambda: leases.list_namespaced_lease(service)),
        ]
    assert allowed == [200] * len(allowed)
    assert denied == [403] * len(denied)

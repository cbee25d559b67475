"""Fixtures for the Kubernetes backend's tests: a real kube-apiserver on loopback (see cluster.py for what it
has and lacks). A missing binary fails the test, locally too: `./dev test` builds it."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from cluster import Cluster, ClusterMissing, start_cluster
from kubelet import TestKubelet, _Api


@pytest.fixture(scope="session")
def kube(tmp_path_factory) -> Iterator[Cluster]:
    """etcd + kube-apiserver 1.20.2 for the session (one per xdist worker): `.url`, `.token` (the admin's,
    group system:masters), `.ca_file`, `.kubeconfig`, `.client()`, `.stop()`/`.start()`/`.restart()`."""
    try:
        with start_cluster(tmp_path_factory.mktemp("kube")) as cluster:
            yield cluster
    except ClusterMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture
def kube_namespace(kube: Cluster) -> str:
    """A fresh namespace for one test. Not deleted afterwards: without a namespace controller a deleted
    namespace only turns Terminating, and the session's API server goes away anyway."""
    from kubernetes import client

    name = f"test-{secrets.token_hex(4)}"
    with kube.client() as api:
        client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


@pytest.fixture
def api(kube) -> _Api:
    """The API server as plain JSON calls (the test kubelet's client), as the admin."""
    return _Api(kube.client())


@pytest.fixture
def namespace(kube_namespace) -> str:
    """A fresh namespace for one test (`kube_namespace`)."""
    return kube_namespace


@pytest.fixture
def kubelet(kube, docker_client, namespace) -> Iterator[TestKubelet]:
    """The test kubelet, running the Pods of `namespace` with Docker; it must end with no errors."""
    with TestKubelet(kube.client(), docker_client, namespace=namespace, node_name=f"node-{namespace}") as running:
        yield running
        assert running.errors == []

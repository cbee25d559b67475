"""A sandbox's `init` (`SandboxSpec.init`): a shell command the manager runs through the agent once
the sandbox is ready, before `create` returns it and before a warm pool holds it.

Real sandboxes of the base image: the init runs once and before the hand-over (a slow one is done
when `create` returns); one that fails, or runs past its timeout, fails the sandbox, which is
deleted, with the tail of its output in the error; pooled sandboxes ran their pool's init, and a
different init is a different pool; a drained pool deletes what waits there and what was still
starting. Through `orchard up` too, where `init` is an extension field of create and pools.
"""

from __future__ import annotations

import time

import httpx
import pytest
from sqlmodel import select

from orchard import store
from orchard.env.backends.base import MAX_INIT, make_spec
from orchard.env.pool import pool_key
from orchard.errors import InvalidRequest, SandboxError
from orchard.store import Store


@pytest.fixture
def fresh(tmp_path, docker_client):
    """An embedded client of its own (its pools and store are this test's alone)."""
    from orchard.env import Client

    with Client(store=Store.open(f"sqlite:///{tmp_path}/o.db")) as client:
        yield client


def containers_of(docker_client, owner: str) -> list[str]:
    found = docker_client.api.containers(all=True, filters={"label": f"org.orchard.owner={owner}"})
    return [c["Labels"]["org.orchard.sandbox"] for c in found]


def wait_for(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds:g} s"
        time.sleep(0.05)


def test_an_init_runs_once_before_create_returns(fresh, base_image):
    init = "sleep 0.5; echo ran >> /tmp/init.log; echo $PWD $GREETING > /tmp/init.env"
    with fresh.create(base_image, init=init, env={"GREETING": "hello"}) as box:
        assert box.read_file("/tmp/init.log") == b"ran\n"  # a slow init is done by the hand-over
        assert box.read_file("/tmp/init.env") == b"/workspace hello\n"  # as any command of the sandbox runs
        assert fresh._manager.get(box.id).status == "ready"
        fresh._manager.flush()
        with store.session(fresh._manager.store) as db:
            commands = db.exec(select(store.ExecRecord).where(store.ExecRecord.sandbox_id == box.id)).all()
        assert [c.command for c in commands] == [init]  # recorded as the sandbox's first command


@pytest.mark.parametrize(
    ("init", "timeout", "message"),
    [
        ("echo starting; echo broken >&2; exit 3", 60.0, r"exited 3; its output ends: starting\s+broken"),
        ("echo waiting; sleep 60", 1.0, r"timed out after 1 s; its output ends: waiting"),
    ],
)
def test_a_failing_init_fails_the_sandbox_deletes_it_and_says_why(
    fresh, base_image, docker_client, init, timeout, message
):
    manager = fresh._manager
    started = time.monotonic()
    with pytest.raises(SandboxError, match=r"the init command of sandbox \S+ " + message):
        fresh.create(base_image, init=init, init_timeout=timeout)
    assert time.monotonic() - started < 30
    assert manager.list() == [] and containers_of(docker_client, manager.owner) == []  # nothing left running
    with store.session(manager.store) as db:
        (record,) = db.exec(select(store.SandboxRecord)).all()
    assert record.status == "failed" and "the init command" in (record.status_message or "")


def test_a_failing_inits_flood_of_output_is_bounded(fresh, base_image):
    """The sandbox is hostile: what the host reads back of an init is capped in the agent
    (`INIT_OUTPUT` a stream), and its error keeps only the tail (`INIT_TAIL`)."""
    from orchard.env.manager import INIT_TAIL

    with pytest.raises(SandboxError, match=r"exited 2; its output ends: x+") as failed:
        fresh.create(base_image, init="head -c 50000000 /dev/zero | tr '\\0' x; exit 2")
    assert len(str(failed.value)) < INIT_TAIL + 200


def test_pooled_sandboxes_ran_their_init_and_another_init_is_another_pool(fresh, base_image):
    manager = fresh._manager
    fresh.warm(base_image, 1, init="echo A > /tmp/which")
    wait_for(lambda: [ready for _spec, _size, ready in manager.pools.sizes()] == [1], "the pool had one ready")
    pooled = {info.sandbox_id for info in manager.list()}
    with fresh.create(base_image, init="echo A > /tmp/which") as box:  # the pool's kind: handed over
        assert box.id in pooled and box.read_file("/tmp/which") == b"A\n"
    with fresh.create(base_image, init="echo B > /tmp/which") as box:  # another init: started anew, and run
        assert box.id not in pooled and box.read_file("/tmp/which") == b"B\n"
    with fresh.create(base_image) as box:  # none: started anew, and nothing run
        assert box.id not in pooled and box.exec("test -e /tmp/which").exit_code == 1
    spec = make_spec(base_image)
    assert pool_key(spec) != pool_key(make_spec(base_image, init="true")) != pool_key(make_spec(base_image, init="x"))


def test_a_pool_whose_init_fails_holds_nothing_and_leaves_nothing(fresh, base_image, docker_client):
    manager = fresh._manager
    fresh.warm(base_image, 1, init="echo no >&2; exit 5")

    def failed() -> list:
        with store.session(manager.store) as db:
            return db.exec(select(store.SandboxRecord).where(store.SandboxRecord.status == "failed")).all()

    wait_for(lambda: failed(), "a pooled sandbox's init failed")
    assert "exited 5; its output ends: no" in (failed()[0].status_message or "")
    assert [ready for _spec, _size, ready in manager.pools.sizes()] == [0]
    fresh.warm(base_image, 0, init="echo no >&2; exit 5")
    assert containers_of(docker_client, manager.owner) == []


def test_a_drained_pool_deletes_what_waits_and_what_is_still_starting(fresh, base_image, docker_client):
    manager = fresh._manager
    fresh.warm(base_image, 2, init="true")
    wait_for(lambda: [ready for _spec, _size, ready in manager.pools.sizes()] == [2], "the pool had two ready")
    fresh.warm(base_image, 1, init="true", drain=True)  # one too many: deleted now
    assert len(manager.list()) == 1 and [ready for _spec, _size, ready in manager.pools.sizes()] == [1]
    fresh.warm(base_image, 3, init="sleep 1")  # another pool, its sandboxes slow to start
    wait_for(lambda: len(manager.list()) > 1, "a slow pooled sandbox began to start")
    fresh.warm(base_image, 0, init="sleep 1", drain=True)  # while they start: deleted once up
    fresh.warm(base_image, 0, init="true", drain=True)
    wait_for(lambda: manager.pools.starting() == 0 and manager.list() == [], "every pooled sandbox was deleted")
    assert containers_of(docker_client, manager.owner) == []
    assert [size for _spec, size, _ready in manager.pools.sizes()] == [0, 0]


def test_an_init_is_checked_before_anything_starts(fresh, base_image):
    for init, timeout in (("", 60), ("   ", 60), ("a\0b", 60), ("x" * (MAX_INIT + 1), 60), ("true", 0), ("true", 1e9)):
        with pytest.raises(InvalidRequest, match="init"):
            fresh.create(base_image, init=init, init_timeout=timeout)
    with pytest.raises(InvalidRequest, match="init"):
        fresh.warm(base_image, 1, init=["not", "a", "string"])  # type: ignore[arg-type]
    assert fresh._manager.list() == [] and fresh._manager.pools.sizes() == []


def test_an_init_through_the_service(service, base_image):
    """`init` and `init_timeout` are extension fields of `POST /sandboxes` and `POST /pools`
    (`drain` of pools too): the remote client sends them, the service's manager runs them."""
    from orchard.env import Client

    url, key = service
    with Client(url=url, api_key=key) as client:
        with client.create(base_image, memory="1Gi", init="echo remote > /tmp/init.log") as box:
            assert box.read_file("/tmp/init.log") == b"remote\n"
        with pytest.raises(SandboxError, match=r"the init command of sandbox \S+ exited 4; its output ends: nope"):
            client.create(base_image, memory="1Gi", init="echo nope; exit 4")
        with pytest.raises(SandboxError, match="timed out after 1 s"):
            client.create(base_image, memory="1Gi", init="sleep 30", init_timeout=1)
        client.warm(base_image, 1, memory="1Gi", init="echo pooled > /tmp/init.log")
        pools = f"{url}/pools"
        wait_for(
            lambda: [p for p in httpx.get(pools, headers={"X-API-Key": key}).json()["pools"] if p["ready"]],
            "the service's pool had one ready",
        )
        with client.create(base_image, memory="1Gi", init="echo pooled > /tmp/init.log") as box:
            assert box.read_file("/tmp/init.log") == b"pooled\n"
        client.warm(base_image, 0, memory="1Gi", init="echo pooled > /tmp/init.log", drain=True)

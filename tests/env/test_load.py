"""Load: 100 sandboxes (25 at a time) x 20 commands, every result right and recorded in the store."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sqlmodel import func, select

from orchard import store
from orchard.env import Client
from orchard.store import Store

SANDBOXES, COMMANDS = 100, 20


def test_hundred_sandboxes_twenty_commands_each_all_recorded(base_image, tmp_path, docker_client):
    """Slow: a load test: a hundred real sandboxes at once is its point."""
    db = f"sqlite:///{tmp_path}/load.db"

    def one_sandbox(client: Client, n: int) -> list[str]:
        with client.create(base_image, run_id="load") as box:
            return [box.exec(f"echo {n}-{i}").stdout for i in range(COMMANDS)]

    with Client(store=Store.open(db)) as client, ThreadPoolExecutor(max_workers=25) as pool:
        outputs = list(pool.map(lambda n: one_sandbox(client, n), range(SANDBOXES)))
        client._manager.flush()
    assert outputs == [[f"{n}-{i}\n" for i in range(COMMANDS)] for n in range(SANDBOXES)]
    with store.session(db) as session:
        records = session.exec(select(func.count()).select_from(store.ExecRecord)).one()
        boxes = session.exec(select(store.SandboxRecord).where(store.SandboxRecord.run_id == "load")).all()
        ok = session.exec(
            select(func.count()).select_from(store.ExecRecord).where(store.ExecRecord.exit_code == 0)
        ).one()
    assert (records, ok) == (SANDBOXES * COMMANDS, SANDBOXES * COMMANDS)
    assert len(boxes) == SANDBOXES and {b.status for b in boxes} == {"deleted"}
    assert not docker_client.api.containers(all=True, filters={"label": "org.orchard.run=load"})

"""The store on a real SQLite file: WAL, many writers, and no half-written rows."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from sqlmodel import func, select

from orchard import store


def _sandbox(i: int, **overrides) -> store.SandboxRecord:
    fields = dict(
        id=f"sb{i}",
        backend="docker",
        image="img",
        network="blocked",
        owner="me",
        status="ready",
        created_at=time.time(),
        ttl=60.0,
    )
    return store.SandboxRecord(**(fields | overrides))


def test_sqlite_store_uses_wal(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    with store.session(url) as db:
        db.add(_sandbox(1))
        mode = db.connection().exec_driver_sql("PRAGMA journal_mode").scalar()
    assert mode == "wal"


def test_a_failing_transaction_leaves_no_row(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    with pytest.raises(RuntimeError), store.session(url) as db:
        db.add(_sandbox(1))
        db.flush()
        raise RuntimeError("crash mid-transaction")
    with store.session(url) as db:
        assert db.exec(select(func.count()).select_from(store.SandboxRecord)).one() == 0


KILLED_MID_TRANSACTION = """
import os, signal, sys, time
from orchard import store
with store.session(sys.argv[1]) as db:
    for i in range(50):
        db.add(store.ExecRecord(id=f"k{i}", sandbox_id="sb", command="true", status="succeeded", created_at=time.time()))
    db.flush()  # the rows are written into the open transaction
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_killed_mid_transaction_leaves_no_row(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    with store.session(url) as db:
        db.add(_sandbox(1))
    child = subprocess.run([sys.executable, "-c", KILLED_MID_TRANSACTION, url])
    assert child.returncode == -9
    with store.session(url) as db:
        assert db.exec(select(func.count()).select_from(store.ExecRecord)).one() == 0
        assert db.get(store.SandboxRecord, "sb1") is not None


WRITER = """
import sys, time
from orchard import store
url, worker = sys.argv[1], int(sys.argv[2])
for i in range(150):
    with store.session(url) as db:
        db.add(store.ExecRecord(id=f"{worker}-{i}", sandbox_id="sb", command="true", status="succeeded",
                                exit_code=0, created_at=time.time()))
"""


def test_concurrent_writers_lose_nothing(tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    store.get_engine(url)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, url, str(w)]) for w in range(4)]
    counts = []
    while any(w.poll() is None for w in writers):
        with store.session(url) as db:  # a reader beside the writers
            counts.append(db.exec(select(func.count()).select_from(store.ExecRecord)).one())
    assert [w.returncode for w in writers] == [0, 0, 0, 0]
    with store.session(url) as db:
        assert db.exec(select(func.count()).select_from(store.ExecRecord)).one() == 600
    assert counts == sorted(counts)


OPENER = """
import sys, time
from orchard import store
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all at the same moment
store.get_engine(sys.argv[1])
"""


def test_processes_opening_a_new_store_together_all_get_its_tables(tmp_path):
    """The processes of a multi-process launch open a store that does not exist yet: they create its
    tables one at a time, instead of failing on a table another one has just made."""
    url = f"sqlite:///{tmp_path}/new.db"
    at = str(time.time() + 3)
    openers = [subprocess.Popen([sys.executable, "-c", OPENER, url, at], stderr=subprocess.PIPE) for _ in range(6)]
    assert [(o.wait(timeout=60), o.stderr.read()[-300:] if o.stderr else b"") for o in openers] == [(0, b"")] * 6
    with store.session(url) as db:
        assert db.exec(select(func.count()).select_from(store.RunRecord)).one() == 0


def test_postgresql_store_via_orchard_db_url(postgres_url, monkeypatch):
    """ORCHARD_DB_URL with a PostgreSQL URL: the same tables, the same transactions, concurrent writers."""
    monkeypatch.setenv("ORCHARD_DB_URL", postgres_url)
    with store.session() as db:
        db.add(_sandbox(1))
    with pytest.raises(RuntimeError), store.session() as db:
        db.add(_sandbox(2))
        db.flush()
        raise RuntimeError("crash mid-transaction")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, postgres_url, str(w)]) for w in range(3)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0]
    with store.session() as db:
        assert [r.id for r in db.exec(select(store.SandboxRecord)).all()] == ["sb1"]
        assert db.exec(select(func.count()).select_from(store.ExecRecord)).one() == 450


def test_sizes_past_2_gib_fit_in_postgresql_and_an_older_store_is_widened(postgres_url):
    """A 16 GiB sandbox's memory_bytes overflows PostgreSQL's INTEGER: the column is BIGINT, and one an
    older Orchard made INTEGER is widened when the store is opened."""
    import sqlalchemy

    store.get_engine(postgres_url)  # the tables exist
    raw = sqlalchemy.create_engine(postgres_url)
    with raw.begin() as connection:  # as an older Orchard made it
        connection.execute(sqlalchemy.text("ALTER TABLE sandboxes ALTER COLUMN memory_bytes TYPE INTEGER"))
    opened = f"from orchard import store; store.get_engine({postgres_url!r}).dispose()"
    subprocess.run([sys.executable, "-c", opened], check=True)  # another process opens the store
    with store.session(postgres_url) as db:
        db.add(_sandbox(16, memory_bytes=16 * 2**30))
    with store.session(postgres_url) as db:
        assert db.get(store.SandboxRecord, "sb16").memory_bytes == 16 * 2**30
    raw.dispose()


def test_a_store_keeps_its_run_folders_next_to_its_database(tmp_path, monkeypatch):
    from orchard.store import Store

    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ORCHARD_DB_URL", raising=False)
    assert Store.open().runs == tmp_path / "home" / "runs"
    elsewhere = Store.open(f"sqlite:///{tmp_path}/elsewhere/o.db")
    assert elsewhere.runs == tmp_path / "elsewhere" / "runs"
    assert Store.open("postgresql://u@127.0.0.1:1/db").runs == tmp_path / "home" / "runs"
    assert elsewhere.run_folder("eval-1").is_dir() and not (tmp_path / "home").exists()


def test_a_store_from_an_older_orchard_gains_the_new_columns(tmp_path):
    """`steps.finish_reason` came later: a store made without it opens, keeps its rows, and stores it."""
    import sqlite3

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    made = f"from orchard import store; store.get_engine({url!r}).dispose()"
    subprocess.run([sys.executable, "-c", made], check=True)  # another process made the store
    with sqlite3.connect(path) as old:  # as an Orchard before the column had it
        old.execute("ALTER TABLE steps DROP COLUMN finish_reason")
        old.execute("INSERT INTO steps (id, trajectory_id, [index], reply, actions, observation, prompt_tokens,"
                    " completion_tokens, duration) VALUES ('t/0', 't', 0, 'hi', '[]', '', 0, 0, 0)")  # fmt: skip
    with store.session(url) as db:
        db.add(store.StepRecord(id="t/1", trajectory_id="t", index=1, reply="cut", finish_reason="length"))
    with store.session(url) as db:
        steps = db.exec(select(store.StepRecord).order_by(store.StepRecord.index)).all()
    assert [(s.reply, s.finish_reason) for s in steps] == [("hi", None), ("cut", "length")]


def test_a_new_column_with_a_default_reads_as_it_in_the_rows_from_before(tmp_path):
    """A column with a default (`results.tokens`, 0) added to an older store: its old rows read 0, not NULL."""
    import sqlite3

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    made = f"from orchard import store; store.get_engine({url!r}).dispose()"
    subprocess.run([sys.executable, "-c", made], check=True)
    with sqlite3.connect(path) as old:  # as an Orchard before the column
        old.execute("ALTER TABLE results DROP COLUMN tokens")
        old.execute("INSERT INTO results (id, run_id, instance_id, harness, sample, outcome, resolved, patch, grade,"
                    " steps, created_at) VALUES ('r/a/h/0', 'r', 'a', 'h', 0, 'resolved', 1, '', '{}', 3, 0)")  # fmt: skip
    with store.session(url) as db:
        (row,) = db.exec(select(store.ResultRecord)).all()
    assert (row.steps, row.tokens) == (3, 0)

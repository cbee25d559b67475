"""The store: one database for everything Orchard does.

SQLite in WAL mode at `$ORCHARD_HOME/orchard.db` by default (mode 0600, its -wal and -shm too);
`ORCHARD_DB_URL` takes any SQLAlchemy URL (PostgreSQL when several hosts or replicas write).
Every write is one short transaction (`with session(store)`), so a crash never leaves a
half-written row.

A `Store` is the database and the folder of run files (reports, summaries) that goes with it: made
once (`Store.open()`, from the settings) and handed to what records, which reaches the database
through `session(store)`. `None` everywhere means the configured store.
"""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.config import private_file, private_folder, settings
from orchard.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlmodel import Session

    from orchard.store.tables import (
        ExecRecord,
        JobAnswerRecord,
        MetricRecord,
        ProxyCallRecord,
        ReplicaRecord,
        ResultRecord,
        RunRecord,
        SandboxRecord,
        StepRecord,
        TrajectoryRecord,
    )

__all__ = [
    "ExecRecord",
    "JobAnswerRecord",
    "MetricRecord",
    "ProxyCallRecord",
    "ReplicaRecord",
    "ResultRecord",
    "RunRecord",
    "SandboxRecord",
    "StepRecord",
    "Store",
    "TrajectoryRecord",
    "get_engine",
    "session",
]

_TABLES = tuple(name for name in __all__ if name.endswith("Record"))
_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    """The tables, imported when first asked for: SQLAlchemy loads only when the store is used."""
    if name not in _TABLES:
        raise AttributeError(f"module 'orchard.store' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("orchard.store.tables"), name)


@dataclass(frozen=True)
class Store:
    """A store: its database's SQLAlchemy URL, and the folder where runs keep their files."""

    url: str
    runs: Path
    """Run folders (`RUNS/RUN_ID/report.md`, ...): next to a SQLite file, else `$ORCHARD_HOME/runs`."""

    @classmethod
    def open(cls, url: str | None = None, *, runs: str | Path | None = None) -> Store:
        """The store at `url` (default: `ORCHARD_DB_URL`, or the SQLite file in `ORCHARD_HOME`)."""
        url = url or settings().db_url
        if runs is None:
            sqlite = url.startswith("sqlite:///") and url != "sqlite:///:memory:"
            runs = Path(url.removeprefix("sqlite:///")).parent / "runs" if sqlite else settings().home / "runs"
        return cls(url, Path(runs))

    def engine(self) -> Engine:
        return get_engine(self.url)

    def run_folder(self, run_id: str) -> Path:
        """The folder of run `run_id`'s files, made if missing."""
        folder = self.runs / run_id
        folder.mkdir(parents=True, exist_ok=True)
        return folder


def _tune_sqlite(dbapi_connection, _record) -> None:
    """WAL lets readers (the dashboard) run beside writers; busy_timeout waits out short locks."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def get_engine(url: str | None = None) -> Engine:
    """The engine for `url` (default: the configured store), created with its tables once."""
    url = url or settings().db_url
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _opened(url)
            _engines[url] = engine
    return engine


def _opened(url: str) -> Engine:
    """`_create`, its failures as one line naming the store (a password masked) and how to fix it."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, DBAPIError

    try:
        return _create(url)
    except ArgumentError as exc:  # not a URL, or an unknown dialect
        raise ConfigError(
            f"the store's URL is not a database URL ({exc}): set ORCHARD_DB_URL to a SQLAlchemy URL, "
            "e.g. sqlite:////path/orchard.db or postgresql://user:password@host/db"
        ) from None
    except ImportError as exc:  # the URL's driver is not installed
        extra = " (pip install 'orchard-agents[postgres]')" if url.startswith("postgresql") else ""
        raise ConfigError(f"the store's database driver is missing: {exc}{extra}") from None
    except DBAPIError as exc:  # the server refused, or is not there
        where = make_url(url).render_as_string(hide_password=True)
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise ConfigError(f"cannot open the store at {where}: {reason}; check ORCHARD_DB_URL") from None


def _create(url: str) -> Engine:
    """The engine, with the tables created; processes that start together take turns at that."""
    from sqlalchemy import event, text
    from sqlmodel import SQLModel, create_engine

    import orchard.store.tables  # noqa: F401  (the tables join SQLModel's metadata)

    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        _private_store(path)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _tune_sqlite)
        with open(private_file(path.with_name(path.name + ".lock")), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            SQLModel.metadata.create_all(engine)
            with engine.begin() as connection:
                _add_new_columns(connection)
        return engine
    engine = create_engine(url, pool_pre_ping=True)
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(4674246)"))  # "ORCH"
        SQLModel.metadata.create_all(connection)
        _add_new_columns(connection)
    return engine


def _add_new_columns(connection) -> None:
    """A store made by an older Orchard gains the columns added since, each nullable or with a
    scalar default (given to the database, so existing rows read as that value, not NULL); a new
    column with neither is refused: its rows could not be read. On PostgreSQL an INTEGER column
    that is BIGINT now is widened; nothing else is rewritten."""
    from sqlalchemy import inspect, literal, text
    from sqlalchemy.sql.schema import ScalarElementColumnDefault
    from sqlmodel import SQLModel

    inspector = inspect(connection)
    for table in SQLModel.metadata.sorted_tables:
        present = {column["name"]: column["type"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                if _widened(present[column.name], column.type) and connection.dialect.name == "postgresql":
                    connection.execute(text(f'ALTER TABLE "{table.name}" ALTER COLUMN "{column.name}" TYPE BIGINT'))
                continue
            kind = column.type.compile(dialect=connection.dialect)
            default = column.default
            if isinstance(default, ScalarElementColumnDefault) and default.arg is not None:
                value = literal(default.arg, column.type).compile(
                    dialect=connection.dialect, compile_kwargs={"literal_binds": True}
                )
                kind += f" DEFAULT {value}"
            elif not column.nullable:
                raise ConfigError(
                    f"the store cannot gain the column {table.name}.{column.name}: it is NOT NULL with no "
                    "scalar default (an Orchard bug: give it one)"
                )
            connection.execute(text(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}'))


def _widened(found: Any, wanted: Any) -> bool:
    """Whether a column an older Orchard made INTEGER is BIGINT now."""
    from sqlalchemy import BigInteger, Integer

    return isinstance(wanted, BigInteger) and isinstance(found, Integer) and not isinstance(found, BigInteger)


def _private_store(path: Path) -> None:
    """The SQLite file made 0600 before SQLite opens it (its -wal and -shm take the file's mode).

    Its folder is made 0700 when new; ORCHARD_HOME is tightened to 0700 too, but a folder of the
    operator's own choosing (ORCHARD_DB_URL) is left as it is.
    """
    if path.parent.resolve() == settings().home.resolve():
        private_folder(path.parent)
    else:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the store's folder {path.parent}: {exc.strerror or exc}") from None
    private_file(path)
    for journal in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if journal.exists():  # left by an older Orchard, perhaps wider
            private_file(journal)


@contextmanager
def session(store: Store | str | None = None) -> Iterator[Session]:
    """One transaction in `store` (a `Store`, a database URL, or None: the configured store):
    committed when the block ends, rolled back if it raises."""
    from sqlmodel import Session

    url = store.url if isinstance(store, Store) else store
    with Session(get_engine(url), expire_on_commit=False) as db:
        try:
            yield db
            db.commit()
        except BaseException:
            db.rollback()
            raise

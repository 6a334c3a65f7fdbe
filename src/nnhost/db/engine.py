"""One `Database` per process: the engine, its pool, and how stores borrow connections.

Stores never hold a connection: each call borrows one from the pool with
`Database.read` (no transaction where the database allows it: one round trip
on PostgreSQL) or `Database.write` (one transaction, committed on success,
rolled back on an exception). The API calls the stores on its event loop
thread, as it did with SQLite alone; the pool lets the other threads that
reach the stores (workers' callbacks, the operator commands) do so safely.

SQLite keeps the settings nnhost always used: WAL (readers never wait for
the writer), synchronous=NORMAL, foreign keys on, and a 5 s busy timeout for
the rare second process (an operator command while the server runs).
PostgreSQL connections are pooled and checked before use, so a restarted
database server costs a reconnect, not a failed request.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Union, cast

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import OperationalError

from .errors import DatabaseError
from .migrate import migrate
from .urls import check_url, engine_url, shown, sqlite_url


class Database:
    def __init__(self, url: str) -> None:
        self.url = engine_url(url)
        self.shown = shown(check_url(url))
        self.dialect = self.url.get_backend_name()
        if self.dialect == "sqlite":
            # check_url refused a SQLite URL without a file, so the URL names one.
            Path(cast(str, self.url.database)).parent.mkdir(parents=True, exist_ok=True)
            self.engine = _sqlite_engine(self.url)
            self._reader: Engine = self.engine
            self._writer: Engine = self.engine.execution_options(**{_WRITES: True})
        else:
            self.engine = create_engine(
                self.url,
                pool_size=5,
                max_overflow=10,
                pool_pre_ping=True,
                pool_recycle=1800,
                connect_args={"connect_timeout": 10, "application_name": "nnhost"},
            )
            self._reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")
            self._writer = self.engine

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with self._reader.connect() as connection:
            yield connection

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        with self._writer.begin() as connection:
            yield connection

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.shown})"


#: Execution option marking the connections `Database.write` hands out.
_WRITES = "nnhost_writes"


def _sqlite_engine(url: URL) -> Engine:
    """SQLite with real transactions: a write takes the write lock when it begins.

    Python's driver would begin a transaction only at the first INSERT/UPDATE,
    after a transaction's reads, so two writers could both read a job and both
    move it. Here the driver's own transaction handling is off, reads run each
    statement alone (WAL gives each a consistent snapshot), and `Database.write`
    begins with BEGIN IMMEDIATE: one writer at a time, waiting up to the busy timeout.
    """
    # Connections move between threads with the pool; each is used by one at a time.
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 5})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=5000"):
            dbapi_connection.execute(f"PRAGMA {pragma}")

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        if connection.get_execution_options().get(_WRITES):
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def connect(target: Union[str, Path]) -> Database:
    """The database at ``target`` (a URL, or the path of a SQLite file), migrated to the head.

    Raises `DatabaseError` when it cannot be reached or was made by a newer nnhost.
    """
    url = sqlite_url(target) if isinstance(target, Path) else target
    database = Database(url)
    try:
        migrate(database.url, database.shown)
        with database.read():
            pass
    except OperationalError as error:
        database.close()
        reason = str(error.orig or error).strip().splitlines()[0]
        raise DatabaseError(
            f"cannot use the database {database.shown}: {reason}. Check that it is running "
            "and that the URL (--database, or `database` in nnhost.toml) is right."
        ) from None
    except BaseException:
        database.close()
        raise
    return database

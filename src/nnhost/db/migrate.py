"""Bring a database to the schema this code expects, once per start, before anything reads it.

The revisions are Alembic scripts shipped inside the package
(``migrations/versions``), applied programmatically: the operator never runs a
migration tool, and an existing data directory keeps working across upgrades.
All pending revisions apply in one transaction under a lock (PostgreSQL: an
advisory lock; SQLite: ``BEGIN IMMEDIATE``), so processes starting together
against one database migrate it once, and a failed start leaves it as it was.
A database at a revision this code does not know (made by a newer nnhost) is
refused, never changed.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import NullPool

from .errors import DatabaseError

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)
# Alembic reports each step (and its plugins, on import) at INFO; one line of ours
# below says what changed. Set before alembic is first imported (lazily, below).
logging.getLogger("alembic").setLevel(logging.WARNING)
MIGRATIONS = Path(__file__).parent / "migrations"
#: Any fixed number: the key of the PostgreSQL advisory lock migrations hold.
_LOCK_KEY = 0x6E6E686F7374


@lru_cache(maxsize=1)
def _config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config()).get_current_head()


def current(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def migrate(url: URL, shown: str) -> None:
    """Apply every revision the database lacks (none: a few milliseconds)."""
    from alembic import command
    from alembic.script import ScriptDirectory

    engine = create_engine(url, poolclass=NullPool)
    if url.get_backend_name() == "sqlite":
        _transactional_sqlite(engine)
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
            before = current(connection)
            script = ScriptDirectory.from_config(_config())
            if before is not None and before not in {rev.revision for rev in script.walk_revisions()}:
                raise DatabaseError(
                    f"the database {shown} is at revision {before}, which this nnhost does not "
                    "know: it was written by a newer version. Run that version (or a newer "
                    "one), or point --database at another database."
                )
            if before == script.get_current_head():
                return
            config = _config()
            config.attributes["connection"] = connection
            try:
                command.upgrade(config, "head")
            finally:
                config.attributes.pop("connection", None)
            log.info("database %s migrated from %s to %s", shown, before or "nothing", current(connection))
    finally:
        engine.dispose()


def _transactional_sqlite(engine: Engine) -> None:
    """Let SQLite run DDL inside a real transaction that also takes the write lock."""

    @event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # the driver's own implicit BEGINs off
        dbapi_connection.execute("PRAGMA busy_timeout=30000")

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

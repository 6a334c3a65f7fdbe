"""The server's one database layer, for SQLite and PostgreSQL alike.

Jobs (`nnhost.jobs.store`) and accounts (`nnhost.auth`) keep their records in
one database, chosen by the ``database`` setting: by default the SQLite file
``DATA_DIR/nnhost.sqlite3``, or ``postgresql://...`` so that several machines
can share it. This package owns everything that depends on which one it is:
the URL (`urls`), the engine and its pool (`engine`), the tables (`tables`)
and how a database gets to them (`migrate`, ``migrations/``).

It is SQLAlchemy Core, not the ORM: the stores speak in rows and their own
dataclasses, and each query stays visible in the store that runs it.
Migrations are Alembic revisions shipped inside the package and applied at
start-up: versioned, so a change to the tables is a new revision that every
existing database goes through, rather than ``CREATE TABLE IF NOT EXISTS``
and column patching scattered over the stores (which is what this replaced,
and which could neither rename nor rebuild a table nor tell a newer database
from an older one). The first revision adopts a database made before there
were migrations, as it is.

To change the schema: edit `tables`, add the next file to
``migrations/versions`` (``revision``/``down_revision`` chained, written by
hand with ``alembic.op``), and tests/test_database.py checks that the result
matches `tables` on both databases.

Nothing here knows about jobs' rules, users' rights, or HTTP.

May import: nothing else of nnhost (every other part keeps its records through it).
"""

from .engine import Database, connect
from .errors import DatabaseError
from .urls import check_url, shown, sqlite_url

__all__ = ["Database", "DatabaseError", "check_url", "connect", "shown", "sqlite_url"]

"""The tables of the server's database, as the code uses them now (the migrations' head).

Jobs and their LOG lines belong to `nnhost.jobs`; users, keys, web sessions and
invites to `nnhost.auth`; both read and write them through this one
definition, so one database serves both on SQLite and on PostgreSQL.

A change here is never enough on its own: a database made by an earlier
version only changes through a new file in ``migrations/versions``, and
tests/test_database.py checks that the migrations arrive at exactly these tables.

Types are chosen to mean the same on both: moments are seconds since the
epoch as double precision (SQLite REAL), flags are 0/1 integers, lists and
tables are JSON text, and sizes are 64-bit.
"""

from __future__ import annotations

from sqlalchemy import (
    REAL,
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect

#: Seconds since the epoch: REAL on SQLite (as nnhost always had it), double precision elsewhere.
Seconds: Double[float] = Double().with_variant(REAL(), "sqlite")
#: A 64-bit count; on SQLite INTEGER, which is already 64-bit (and, as a key, the rowid).
Count = BigInteger().with_variant(Integer(), "sqlite")


class FreeText(TypeDecorator[str]):
    """Text written by users or their code: what no database can hold is replaced.

    PostgreSQL refuses NUL characters in text and neither database can encode a
    lone surrogate; a job's log line or description holding one must still be kept.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None:
            return value
        if "\x00" in value:
            value = value.replace("\x00", "\ufffd")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "replace").decode("utf-8")
        return value


metadata = MetaData()

jobs = Table(
    "jobs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("user_id", Integer, nullable=False),
    Column("model_key", Text, nullable=False),
    Column("deployment", Text, nullable=False),
    Column("session_id", Text, nullable=False, server_default=""),
    Column("compress", Integer, nullable=False, server_default="0"),
    Column("env", Text, nullable=False, server_default="{}"),
    Column("status", Text, nullable=False),
    Column("description", FreeText, nullable=False, server_default=""),
    Column("meta", Text),
    Column("created_at", Seconds, nullable=False),
    Column("updated_at", Seconds, nullable=False),
    Column("base_url", Text, nullable=False, server_default=""),
    Column("result_size", Count),
    Column("result_expires_at", Seconds),
    #: When the controller handed the job to a replica: from then on it may have run,
    #: so a controller that takes over fails it rather than running it again.
    Column("started_at", Seconds),
    Column("priority", Integer, nullable=False, server_default="0"),
    #: The client's Python (``3.12.1``), from its ``python-version`` header: the payload's
    #: reader translates or refuses what that Python records and the server's cannot.
    Column("client_python", Text, nullable=False, server_default=""),
    #: The served nnsight version the client's matched (``0.8.0``; empty: the server's own).
    Column("client_version", Text, nullable=False, server_default=""),
    Index("jobs_by_status", "status"),
    Index("jobs_by_user", "user_id", "created_at"),
)

job_logs = Table(
    "job_logs",
    metadata,
    # Lines are read back in the order they were written: by this id.
    Column("id", Count, primary_key=True, autoincrement=True),
    Column("job_id", Text, nullable=False),
    Column("at", Seconds, nullable=False),
    Column("line", FreeText, nullable=False),
    Index("job_logs_by_job", "job_id"),
    Index("job_logs_by_time", "at"),
)

users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("email", Text, nullable=False, unique=True),
    Column("tags", Text, nullable=False, server_default="[]"),
    Column("disabled", Integer, nullable=False, server_default="0"),
    Column("created_at", Seconds, nullable=False),
    Column("password_hash", Text),
    sqlite_autoincrement=True,
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False),
    Column("prefix", Text, nullable=False),
    Column("hash", Text, nullable=False, unique=True),
    Column("name", FreeText, nullable=False, server_default=""),
    Column("created_at", Seconds, nullable=False),
    Column("expires_at", Seconds),
    Column("revoked_at", Seconds),
    Column("last_used_at", Seconds),
    Index("api_keys_by_user", "user_id"),
    sqlite_autoincrement=True,
)

web_sessions = Table(
    "web_sessions",
    metadata,
    Column("hash", Text, primary_key=True),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False),
    Column("created_at", Seconds, nullable=False),
    Column("expires_at", Seconds, nullable=False),
    Index("web_sessions_by_user", "user_id"),
)

invites = Table(
    "invites",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("hash", Text, nullable=False, unique=True),
    Column("prefix", Text, nullable=False),
    Column("tags", Text, nullable=False, server_default="[]"),
    Column("note", FreeText, nullable=False, server_default=""),
    Column("created_at", Seconds, nullable=False),
    Column("expires_at", Seconds),
    Column("used_at", Seconds),
    Column("used_by", Integer, ForeignKey("users.id")),
    sqlite_autoincrement=True,
)

#: A submitted job's payload, where processes on other machines can read it: written
#: with the job by an API process, read by whichever controller runs it, deleted when
#: the job ends. (With ``role = "all"`` payloads stay files in the data directory.)
job_payloads = Table(
    "job_payloads",
    metadata,
    Column("job_id", Text, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

#: Who is the controller: one row, renewed by its holder while it lives.
leases = Table(
    "leases",
    metadata,
    Column("name", Text, primary_key=True),
    Column("holder", Text, nullable=False),
    Column("acquired_at", Seconds, nullable=False),
    Column("expires_at", Seconds, nullable=False),
)

#: Values every process of one deployment shares: the controller's published state
#: (what /status, the status page and /metrics show on an API process) and secrets.
shared_values = Table(
    "shared_values",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", Seconds, nullable=False),
)

#: What an API process asks of the controller (cancel a job, deploy or evict a
#: model), durable so that a request made while controllers change hands is kept.
commands = Table(
    "commands",
    metadata,
    Column("id", Count, primary_key=True, autoincrement=True),
    Column("kind", Text, nullable=False),
    Column("args", Text, nullable=False, server_default="{}"),
    Column("created_at", Seconds, nullable=False),
    Column("done_at", Seconds),
    Column("result", Text),
    Index("commands_pending", "done_at"),
)

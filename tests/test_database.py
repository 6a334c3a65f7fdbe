"""The database layer itself: migrations, adopting old data directories, URLs, PostgreSQL end to end.

The old schema below is the one nnhost's stores created with ``CREATE TABLE IF
NOT EXISTS`` before it had migrations (and, for the oldest databases, without
``users.password_hash``): a data directory made by that code must start and
keep every row.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from compare import assert_same
from conftest import API_KEY, TEST_REPO
from sqlalchemy import text

from nnhost.auth.keys import KeyStore, hash_key
from nnhost.config import Settings, SettingsError, load_settings
from nnhost.db import DatabaseError, connect
from nnhost.db.migrate import head
from nnhost.db.tables import metadata
from nnhost.jobs.job import Status
from nnhost.jobs.store import JobStore
from nnhost.testing import ServerProcess, free_port

OLD_JOBS = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, user_id INTEGER NOT NULL, model_key TEXT NOT NULL,
    deployment TEXT NOT NULL, session_id TEXT NOT NULL DEFAULT '',
    compress INTEGER NOT NULL DEFAULT 0, env TEXT NOT NULL DEFAULT '{}', status TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '', meta TEXT, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, base_url TEXT NOT NULL DEFAULT '', result_size INTEGER,
    result_expires_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status);
CREATE INDEX IF NOT EXISTS jobs_by_user ON jobs (user_id, created_at);
CREATE TABLE IF NOT EXISTS job_logs (job_id TEXT NOT NULL, at REAL NOT NULL, line TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS job_logs_by_job ON job_logs (job_id);
CREATE INDEX IF NOT EXISTS job_logs_by_time ON job_logs (at);
"""
OLD_USERS = """
CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY AUTOINCREMENT, email TEXT NOT NULL UNIQUE,
    tags TEXT NOT NULL DEFAULT '[]', disabled INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL{password}
);
CREATE TABLE IF NOT EXISTS api_keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT, user_id INTEGER NOT NULL REFERENCES users (id),
    prefix TEXT NOT NULL, hash TEXT NOT NULL UNIQUE, name TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL, expires_at REAL, revoked_at REAL, last_used_at REAL
);
CREATE INDEX IF NOT EXISTS api_keys_by_user ON api_keys (user_id);
"""
OLD_ACCOUNTS = """
CREATE TABLE IF NOT EXISTS web_sessions (
    hash TEXT PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users (id),
    created_at REAL NOT NULL, expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS web_sessions_by_user ON web_sessions (user_id);
CREATE TABLE IF NOT EXISTS invites (
    id INTEGER PRIMARY KEY AUTOINCREMENT, hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]', note TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL,
    expires_at REAL, used_at REAL, used_by INTEGER REFERENCES users (id)
);
"""
OLD_KEY = "nnh_old_" + "o" * 40
PROMPT = "The Eiffel Tower is in the city of"


def make_old_database(path, *, complete: bool = True) -> None:
    """A database as the code before migrations left it (``complete=False``: the oldest kind,
    made by ``nnhost users add`` before any ``serve``, with no password column)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(OLD_USERS.format(password=",\n    password_hash TEXT" if complete else ""))
    db.execute("INSERT INTO users (email, tags, created_at) VALUES ('admin@localhost', '[\"admin\"]', 1.0)")
    db.execute(
        "INSERT INTO api_keys (user_id, prefix, hash, name, created_at) VALUES (1, ?, ?, 'old', 1.0)",
        (OLD_KEY[:12], hash_key(OLD_KEY)),
    )
    if complete:
        db.executescript(OLD_JOBS + OLD_ACCOUNTS)
        db.execute(
            "INSERT INTO jobs (id, user_id, model_key, deployment, status, description,"
            " created_at, updated_at) VALUES ('old-job', 1, 'k', ?, 'ERROR', 'it failed', 2.0, 3.0)",
            (TEST_REPO,),
        )
        # Written out of time order: the order kept is the order written (the rowid).
        for at, line in ((5.0, "first"), (4.0, "second"), (6.0, "third")):
            db.execute("INSERT INTO job_logs (job_id, at, line) VALUES ('old-job', ?, ?)", (at, line))
    db.close()


def revision_of(database) -> str:
    with database.read() as db:
        return db.execute(text("SELECT version_num FROM alembic_version")).scalar_one()


def test_migrations_arrive_at_exactly_the_tables_the_code_uses(database_url):
    database = connect(database_url)
    try:
        with database.read() as db:
            differences = compare_metadata(MigrationContext.configure(db), metadata)
        assert differences == []
        assert revision_of(database) == head()
    finally:
        database.close()
    connect(database_url).close()  # a second start changes nothing


@pytest.mark.parametrize("complete", [True, False], ids=["old", "oldest"])
def test_a_database_made_before_migrations_is_adopted_with_every_row(tmp_path, complete):
    path = tmp_path / "nnhost.sqlite3"
    make_old_database(path, complete=complete)
    database = connect(path)
    try:
        assert revision_of(database) == head()
        with database.read() as db:
            differences = compare_metadata(MigrationContext.configure(db), metadata)
        # The one difference left: SQLite reports the old, undeclared ``PRIMARY KEY``
        # columns as nullable (it never stores NULL in a rowid key, and nnhost never wrote one).
        assert all(
            change[0] == "modify_nullable" and metadata.tables[change[2]].c[change[3]].primary_key
            for (change,) in differences
        ), differences
        keys = KeyStore(database)
        assert keys.check(OLD_KEY).principal.email == "admin@localhost"
        assert keys.add_user("new@example.org", password_hash="h") == 2
        store = JobStore(database)
        if complete:
            job = store.get("old-job")
            assert job.status is Status.ERROR and job.description == "it failed"
            assert store.logs("old-job") == ["first", "second", "third"]
        store.add_log("old-job", "fourth")
        assert store.logs("old-job")[-1] == "fourth"
    finally:
        database.close()


def test_a_database_from_a_newer_nnhost_is_refused_untouched(tmp_path):
    path = tmp_path / "nnhost.sqlite3"
    connect(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(DatabaseError, match="revision 9999.*newer version"):
        connect(path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [("9999",)]


def test_processes_starting_together_migrate_a_new_database_once(postgres):
    url = postgres.new_database()
    errors, databases = [], []

    def start():
        try:
            databases.append(connect(url))
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(databases) == 4
    assert {revision_of(database) for database in databases} == {head()}
    for database in databases:
        database.close()


def test_database_urls_are_checked_and_normalised(tmp_path):
    assert Settings(data_dir=tmp_path).database_url == f"sqlite:///{tmp_path / 'nnhost.sqlite3'}"
    given = Settings(database="postgres://u:p@db.example:5433/nn")
    assert given.database == given.database_url == "postgresql://u:p@db.example:5433/nn"
    assert Settings(database="postgresql+psycopg://u@h/nn").database == "postgresql://u@h/nn"
    for bad, reason in (
        ("mysql://u@h/nn", "not supported"),
        ("sqlite://", "in-memory"),
        ("postgresql+psycopg2://u@h/nn", "driver"),
        ("postgresql://u@h", "name the database"),
        ("not a url", "not a database URL"),
    ):
        with pytest.raises(SettingsError, match=reason) as refused:
            load_settings({"data_dir": str(tmp_path), "database": bad})
        assert "--database" in str(refused.value)


def _serve(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "serve", TEST_REPO, "--port", str(free_port()), *args],
        capture_output=True, text=True, timeout=timeout,
    )


def test_serve_refuses_a_bad_or_unreachable_database_saying_so(tmp_path):
    bad = _serve("--data-dir", str(tmp_path), "--database", "mysql://u@h/nn")
    assert bad.returncode == 2 and "nnhost serve: setting database" in bad.stderr
    assert "postgresql://" in bad.stderr and "Traceback" not in bad.stderr
    port = free_port()  # nothing listens there
    gone = _serve("--data-dir", str(tmp_path), "--database", f"postgresql://u:secret@127.0.0.1:{port}/nn")
    assert gone.returncode == 2 and "cannot use the database postgresql://u:***@127.0.0.1" in gone.stderr
    assert "secret" not in gone.stderr and "Traceback" not in gone.stderr


def test_a_server_starts_on_a_data_directory_made_before_migrations(root, server_hf_home, test_snapshot):
    data_dir = root / "old-data"
    make_old_database(data_dir / "nnhost.sqlite3")
    with ServerProcess([TEST_REPO], data_dir=data_dir, hf_home=server_hf_home, api_key=API_KEY) as server:
        old = httpx.get(f"{server.url}/response/old-job", headers={"ndif-api-key": OLD_KEY})
        assert old.status_code == 200, old.text
        assert old.json()["status"] == "ERROR" and old.json()["description"] == "it failed"



def _remote_logits(remote_model, server, key, blocking=True):
    from nnsight import CONFIG

    previous = CONFIG.API.HOST, CONFIG.API.APIKEY
    CONFIG.API.HOST, CONFIG.API.APIKEY = server.url, key
    try:
        with remote_model.trace(PROMPT, remote=True, blocking=blocking) as tracer:
            logits = remote_model.lm_head.output.save()
        if blocking:
            return logits, None
        backend = tracer.backend
        deadline = time.monotonic() + 60
        result = backend()
        while result is None and time.monotonic() < deadline:
            time.sleep(0.1)
            result = backend()
        return result["logits"], backend.job_id
    finally:
        CONFIG.API.HOST, CONFIG.API.APIKEY = previous


def test_a_server_on_postgresql_serves_traces_and_keeps_jobs_and_keys_across_a_restart(
    root, postgres, server_hf_home, remote_model, local_model
):
    url = postgres.new_database()
    data_dir = root / "postgres-data"

    def server():
        return ServerProcess([TEST_REPO], data_dir=data_dir, hf_home=server_hf_home,
                             api_key=API_KEY, extra_args=["--database", url])

    with local_model.trace(PROMPT):
        expected = local_model.lm_head.output.save()
    with server() as first:
        made = subprocess.run(
            [sys.executable, "-m", "nnhost.cli", "keys", "create", "--database", url, "--name", "pg"],
            capture_output=True, text=True, timeout=60,
        )
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip()
        logits, _ = _remote_logits(remote_model, first, API_KEY)
        assert_same(logits, expected)
        logits, job_id = _remote_logits(remote_model, first, key, blocking=False)
        assert_same(logits, expected)
    assert not (data_dir / "nnhost.sqlite3").exists()  # everything went to PostgreSQL
    with server() as second:
        kept = httpx.get(f"{second.url}/response/{job_id}", headers={"ndif-api-key": key})
        assert kept.status_code == 200 and kept.json()["status"] == "COMPLETED", kept.text
        logits, _ = _remote_logits(remote_model, second, key)
        assert_same(logits, expected)

"""Durable job records in SQLite (WAL): every transition is on disk before it is announced.

One database file under the data directory holds the jobs, their log lines,
and (see `nnhost.auth`) users and keys. The store enforces the lifecycle of
`job.py` on every write, so the history on disk is always a possible one.

Writes are small and SQLite in WAL mode commits them in well under a
millisecond, so the API's event loop calls the store directly. It knows
nothing about HTTP.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterable, Optional

from .job import Job, Status, check_transition

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    user_id INTEGER NOT NULL,
    model_key TEXT NOT NULL,
    deployment TEXT NOT NULL,
    session_id TEXT NOT NULL DEFAULT '',
    compress INTEGER NOT NULL DEFAULT 0,
    env TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    meta TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    base_url TEXT NOT NULL DEFAULT '',
    result_size INTEGER,
    result_expires_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status);
CREATE INDEX IF NOT EXISTS jobs_by_user ON jobs (user_id, created_at);
CREATE TABLE IF NOT EXISTS job_logs (
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    line TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS job_logs_by_job ON job_logs (job_id);
CREATE INDEX IF NOT EXISTS job_logs_by_time ON job_logs (at);
"""


def connect(path: Path) -> sqlite3.Connection:
    """One connection to the server's database, set up for many small writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    connection.row_factory = sqlite3.Row
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("PRAGMA foreign_keys=ON")
    connection.execute("PRAGMA busy_timeout=5000")
    return connection


class JobStore:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        self._lock = threading.Lock()
        self._db.executescript(SCHEMA)

    # -- reads ---------------------------------------------------------------

    def get(self, job_id: str) -> Optional[Job]:
        row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def with_status(self, statuses: Iterable[Status]) -> list[Job]:
        names = [status.value for status in statuses]
        marks = ",".join("?" * len(names))
        rows = self._db.execute(
            f"SELECT * FROM jobs WHERE status IN ({marks}) ORDER BY created_at", names
        ).fetchall()
        return [_job(row) for row in rows]

    def for_user(self, user_id: int, limit: int = 50) -> list[Job]:
        rows = self._db.execute(
            "SELECT * FROM jobs WHERE user_id = ? ORDER BY created_at DESC LIMIT ?",
            (user_id, limit),
        ).fetchall()
        return [_job(row) for row in rows]

    def unfinished_count(self, user_id: int) -> int:
        """How many of the user's jobs are waiting or running (for the queued-jobs limit)."""
        return self._db.execute(
            "SELECT COUNT(*) FROM jobs WHERE user_id = ? AND status NOT IN (?, ?)",
            (user_id, Status.COMPLETED.value, Status.ERROR.value),
        ).fetchone()[0]

    def search(
        self,
        *,
        user_id: Optional[int] = None,
        deployment: Optional[str] = None,
        status: Optional[Status] = None,
        limit: int = 100,
    ) -> list[Job]:
        """Most recent jobs first, optionally of one user, deployment and/or status."""
        clauses, values = [], []
        if status is not None:
            clauses.append("status = ?")
            values.append(status.value)
        if user_id is not None:
            clauses.append("user_id = ?")
            values.append(user_id)
        if deployment is not None:
            clauses.append("deployment = ?")
            values.append(deployment)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._db.execute(
            f"SELECT * FROM jobs {where} ORDER BY created_at DESC LIMIT ?", (*values, limit)
        ).fetchall()
        return [_job(row) for row in rows]

    def expired_results(self, now: float) -> list[Job]:
        rows = self._db.execute(
            "SELECT * FROM jobs WHERE result_expires_at IS NOT NULL AND result_expires_at <= ?",
            (now,),
        ).fetchall()
        return [_job(row) for row in rows]

    def logs(self, job_id: str) -> list[str]:
        rows = self._db.execute(
            "SELECT line FROM job_logs WHERE job_id = ? ORDER BY rowid", (job_id,)
        ).fetchall()
        return [row["line"] for row in rows]

    # -- writes --------------------------------------------------------------

    def create(self, job: Job) -> Job:
        now = time.time()
        job.created_at = job.updated_at = now
        with self._lock:
            self._db.execute(
                "INSERT INTO jobs (id, user_id, model_key, deployment, session_id, compress,"
                " env, status, description, meta, created_at, updated_at, base_url)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job.id,
                    job.user_id,
                    job.model_key,
                    job.deployment,
                    job.session_id,
                    int(job.compress),
                    json.dumps(job.env),
                    job.status.value,
                    job.description,
                    json.dumps(job.meta) if job.meta is not None else None,
                    job.created_at,
                    job.updated_at,
                    job.base_url,
                ),
            )
        return job

    def transition(
        self,
        job_id: str,
        status: Status,
        description: str,
        *,
        meta: Optional[dict] = None,
        result_size: Optional[int] = None,
        result_expires_at: Optional[float] = None,
    ) -> Job:
        """Move a job to ``status``, refusing transitions the lifecycle forbids."""
        with self._lock:
            job = self.get(job_id)
            if job is None:
                raise KeyError(job_id)
            check_transition(job.status, status)
            job.status, job.description, job.updated_at = status, description, time.time()
            if meta is not None:
                job.meta = meta
            if result_size is not None:
                job.result_size = result_size
                job.result_expires_at = result_expires_at
            self._db.execute(
                "UPDATE jobs SET status = ?, description = ?, meta = ?, updated_at = ?,"
                " result_size = ?, result_expires_at = ? WHERE id = ?",
                (
                    job.status.value,
                    job.description,
                    json.dumps(job.meta) if job.meta is not None else None,
                    job.updated_at,
                    job.result_size,
                    job.result_expires_at,
                    job.id,
                ),
            )
        return job

    def forget_result(self, job_id: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE jobs SET result_expires_at = NULL WHERE id = ?", (job_id,)
            )

    def delete_logs(self, job_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM job_logs WHERE job_id = ?", (job_id,))

    def delete_logs_before(self, at: float) -> int:
        """Delete LOG lines written before ``at``; returns how many."""
        with self._lock:
            return self._db.execute("DELETE FROM job_logs WHERE at < ?", (at,)).rowcount

    def add_log(self, job_id: str, line: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO job_logs (job_id, at, line) VALUES (?, ?, ?)",
                (job_id, time.time(), line),
            )


def _job(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        user_id=row["user_id"],
        model_key=row["model_key"],
        deployment=row["deployment"],
        session_id=row["session_id"],
        compress=bool(row["compress"]),
        env=json.loads(row["env"]),
        status=Status(row["status"]),
        description=row["description"],
        meta=json.loads(row["meta"]) if row["meta"] else None,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        base_url=row["base_url"],
        result_size=row["result_size"],
        result_expires_at=row["result_expires_at"],
    )

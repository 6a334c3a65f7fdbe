"""Durable job records: every transition is in the database before it is announced.

The server's database (see `nnhost.db`: SQLite by default, or PostgreSQL) holds
the jobs, their log lines, and (see `nnhost.auth`) users and keys. The store
enforces the lifecycle of `job.py` on every write, so the history stored is
always a possible one; a transition reads and writes its row in one
transaction, locking the row where the database can (PostgreSQL), so two
processes cannot both move one job.

Every method blocks on the database, so no event loop calls one itself: the
API goes through `storage.blocking.run_blocking` (`front.jobs.JobFront`), and
the controller writes through its `controller.recorder.Recorder`, whose one writer calls
the store in a worker thread, and reads through `run_blocking` too. A slow
database holds a worker thread rather than the event loop. It knows nothing
about HTTP, nor which database it is talking to.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, TypedDict, Union, Unpack

from sqlalchemy import Select, bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection, RowMapping

from ..db import Database
from ..db import connect as _connect_database
from ..db.tables import job_logs, jobs
from .job import UNFINISHED, InvalidTransition, Job, Status, check_transition


def connect(target: Union[Path, str]) -> Database:
    """The server's database (a SQLite file's path, or a URL), migrated and ready."""
    return _connect_database(target)


# The statements of the calls made for every job and LOG line, built once
# (building one costs about as much as running it).
_GET = select(jobs).where(jobs.c.id == bindparam("job_id"))
_LOCK_ROW = _GET.with_for_update()
_ADD_LOG = insert(job_logs).values(
    job_id=bindparam("job_id"), at=bindparam("at"), line=bindparam("line")
)
_CREATE = insert(jobs)
#: A user's jobs that have not ended, found through the status index: the
#: unfinished are few, while a user's jobs of all time grow without end.
_UNFINISHED = select(func.count()).where(
    jobs.c.status.in_([status.value for status in UNFINISHED]),
    jobs.c.user_id == bindparam("user_id"),
)
_TRANSITION = (
    update(jobs)
    .where(jobs.c.id == bindparam("job_id"))
    .values(
        status=bindparam("status"),
        description=bindparam("description"),
        meta=bindparam("meta"),
        updated_at=bindparam("updated_at"),
        result_size=bindparam("result_size"),
        result_expires_at=bindparam("result_expires_at"),
        started_at=bindparam("started_at"),
    )
)


class Changes(TypedDict, total=False):
    """What `JobStore.transition` may change besides status and description (its keywords)."""

    meta: Optional[dict[str, Any]]
    result_size: Optional[int]
    result_expires_at: Optional[float]
    started: bool


@dataclass(frozen=True)
class Transition:
    """One `JobStore.transition`, as `JobStore.apply` takes it."""

    job_id: str
    status: Status
    description: str
    fields: Changes = field(default_factory=lambda: Changes())


@dataclass(frozen=True)
class LogLine:
    """One `JobStore.add_log`, as `JobStore.apply` takes it."""

    job_id: str
    line: str


#: What `JobStore.apply` made of each write: the job as stored (a transition),
#: True (a LOG line), or why the store refused a transition (nothing of it written).
Applied = Union[Job, bool, InvalidTransition, KeyError]


class JobStore:
    def __init__(self, database: Database) -> None:
        self.database = database
        # One writer at a time within this process; across processes the row lock does it.
        self._lock = threading.Lock()

    def _jobs(self, query: Select[Any]) -> list[Job]:
        with self.database.read() as db:
            return [_job(row) for row in db.execute(query).mappings()]

    # -- reads ---------------------------------------------------------------

    def get(self, job_id: str) -> Optional[Job]:
        with self.database.read() as db:
            row = db.execute(_GET, {"job_id": job_id}).mappings().first()
        return _job(row) if row else None

    def with_status(self, statuses: Iterable[Status]) -> list[Job]:
        names = [status.value for status in statuses]
        return self._jobs(select(jobs).where(jobs.c.status.in_(names)).order_by(jobs.c.created_at))

    def for_user(self, user_id: int, limit: int = 50) -> list[Job]:
        return self._jobs(
            select(jobs)
            .where(jobs.c.user_id == user_id)
            .order_by(jobs.c.created_at.desc())
            .limit(limit)
        )

    def unfinished_count(self, user_id: int) -> int:
        """How many of the user's jobs are waiting or running (for the queued-jobs limit)."""
        with self.database.read() as db:
            return db.execute(_UNFINISHED, {"user_id": user_id}).scalar_one()

    def search(
        self,
        *,
        user_id: Optional[int] = None,
        deployment: Optional[str] = None,
        status: Optional[Status] = None,
        limit: int = 100,
    ) -> list[Job]:
        """Most recent jobs first, optionally of one user, deployment and/or status."""
        query = select(jobs)
        if status is not None:
            query = query.where(jobs.c.status == status.value)
        if user_id is not None:
            query = query.where(jobs.c.user_id == user_id)
        if deployment is not None:
            query = query.where(jobs.c.deployment == deployment)
        return self._jobs(query.order_by(jobs.c.created_at.desc()).limit(limit))

    def expired_results(self, now: float) -> list[Job]:
        return self._jobs(
            select(jobs).where(
                jobs.c.result_expires_at.is_not(None), jobs.c.result_expires_at <= now
            )
        )

    def logs(self, job_id: str) -> list[str]:
        query = select(job_logs.c.line).where(job_logs.c.job_id == job_id).order_by(job_logs.c.id)
        with self.database.read() as db:
            return list(db.execute(query).scalars())

    # -- writes --------------------------------------------------------------

    def create(self, job: Job) -> Job:
        now = time.time()
        job.created_at = job.updated_at = now
        with self._lock, self.database.write() as db:
            db.execute(
                _CREATE,
                {
                    "id": job.id,
                    "user_id": job.user_id,
                    "model_key": job.model_key,
                    "deployment": job.deployment,
                    "session_id": job.session_id,
                    "compress": int(job.compress),
                    "env": json.dumps(job.env),
                    "status": job.status.value,
                    "description": job.description,
                    "meta": json.dumps(job.meta) if job.meta is not None else None,
                    "created_at": job.created_at,
                    "updated_at": job.updated_at,
                    "base_url": job.base_url,
                    "priority": int(job.priority),
                    "client_python": job.client_python,
                    "client_version": job.client_version,
                },
            )
        return job

    def transition(
        self, job_id: str, status: Status, description: str, **fields: Unpack[Changes]
    ) -> Job:
        """Move a job to ``status``, refusing transitions the lifecycle forbids.

        ``started`` stamps the moment the job was handed to a replica (from
        then on it may have run); a job back in the queue loses its stamp.
        """
        with self._lock, self.database.write() as db:
            return _move(db, job_id, status, description, fields)

    def apply(self, writes: list[Union[Transition, LogLine]]) -> list[Applied]:
        """Several writes in order, in one transaction (one commit instead of one each).

        A transition the lifecycle forbids, or of a job not stored, writes
        nothing and is answered with its refusal; the others are written. Any
        other failure (the database's) raises, and nothing of them is stored.
        """
        applied: list[Applied] = []
        lines: list[dict[str, Any]] = []
        with self._lock, self.database.write() as db:
            for write in writes:
                if isinstance(write, LogLine):
                    lines.append({"job_id": write.job_id, "at": time.time(), "line": write.line})
                    applied.append(True)
                    continue
                if lines:  # several lines, one statement
                    db.execute(_ADD_LOG, lines)
                    lines = []
                try:
                    applied.append(_move(db, write.job_id, write.status, write.description, write.fields))
                except (InvalidTransition, KeyError) as refused:
                    applied.append(refused)
            if lines:
                db.execute(_ADD_LOG, lines)
        return applied

    def forget_result(self, job_id: str) -> None:
        with self._lock, self.database.write() as db:
            db.execute(update(jobs).where(jobs.c.id == job_id).values(result_expires_at=None))

    def delete_logs(self, job_id: str) -> None:
        with self._lock, self.database.write() as db:
            db.execute(delete(job_logs).where(job_logs.c.job_id == job_id))

    def delete_logs_before(self, at: float) -> int:
        """Delete LOG lines written before ``at``; returns how many."""
        with self._lock, self.database.write() as db:
            return db.execute(delete(job_logs).where(job_logs.c.at < at)).rowcount

    def add_log(self, job_id: str, line: str) -> None:
        with self._lock, self.database.write() as db:
            db.execute(_ADD_LOG, {"job_id": job_id, "at": time.time(), "line": line})


def _move(db: Connection, job_id: str, status: Status, description: str, fields: Changes) -> Job:
    """A transition in ``db``'s transaction; refused (raised) before anything is written."""
    row = db.execute(_LOCK_ROW, {"job_id": job_id}).mappings().first()
    if row is None:
        raise KeyError(job_id)
    job = _job(row)
    change(job, status, description, **fields)
    db.execute(
        _TRANSITION,
        {
            "job_id": job.id,
            "status": job.status.value,
            "description": job.description,
            "meta": json.dumps(job.meta) if job.meta is not None else None,
            "updated_at": job.updated_at,
            "result_size": job.result_size,
            "result_expires_at": job.result_expires_at,
            "started_at": job.started_at,
        },
    )
    return job


def change(job: Job, status: Status, description: str, **fields: Unpack[Changes]) -> None:
    """Apply a transition to ``job`` in place (`InvalidTransition` if the lifecycle forbids it).

    The one statement of what a transition changes: the store applies it to the
    row it locked, the controller's `recorder.Recorder` to the job it holds, so
    the two cannot disagree on anything but the moment (``updated_at``).
    """
    check_transition(job.status, status)
    job.status, job.description, job.updated_at = status, description, time.time()
    meta, result_size = fields.get("meta"), fields.get("result_size")
    if meta is not None:
        job.meta = meta
    if result_size is not None:
        job.result_size = result_size
        job.result_expires_at = fields.get("result_expires_at")
    if fields.get("started", False):
        job.started_at = job.updated_at
    elif status is Status.QUEUED:
        job.started_at = None


def _job(row: RowMapping) -> Job:
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
        priority=bool(row["priority"]),
        started_at=row["started_at"],
        client_python=row["client_python"],
        client_version=row["client_version"],
    )

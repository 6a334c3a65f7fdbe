"""What a replica reports is untrusted: the job service checks it, caps it, and sweeps.

These drive `JobService` directly, as the deployment manager does, with the
events a worker that user code took over could send: forged job ids, other
deployments' jobs, impossible transitions, huge or ill-typed fields, endless
output. None may raise, change a job it should not, or grow the database past
the caps; a job no replica finishes is failed once its time is up; a job's LOG
lines go with its result at retention.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from sqlalchemy import text

from nnhost.config import Settings
from nnhost.controller.scheduler import Scheduler
from nnhost.controller.service import JobService
from nnhost.controller.upkeep import STUCK_MARGIN
from nnhost.execution.events import JobEvent
from nnhost.jobs.bus import LocalEventBus
from nnhost.jobs.job import Job, Status
from nnhost.jobs.store import JobStore, connect
from nnhost.jobs.update import JobUpdate
from nnhost.storage.blobs import BlobDir
from nnhost.storage.links import LinkSigner
from nnhost.storage.results import DirectoryStore

MiB = 1024 * 1024


class Replicas:
    """The deployment manager's one call the sweeper makes: stop a job on its replica."""

    def __init__(self) -> None:
        self.cancelled: list[tuple[str, str]] = []

    def cancel(self, name: str, job_id: str) -> bool:
        self.cancelled.append((name, job_id))
        return True


@pytest.fixture
def service(tmp_path, database_url):
    """The job service on each database (SQLite, then PostgreSQL)."""
    settings = Settings(data_dir=tmp_path, time_limit=60, kill_grace=5)
    store = JobStore(connect(database_url))
    service = JobService(
        settings, store, LocalEventBus(), Scheduler(), Replicas(),
        BlobDir(tmp_path / "payloads", ".payload"),
        DirectoryStore(tmp_path / "results", LinkSigner(b"test")),
    )
    yield service
    store.database.close()


def running_job(service, job_id, *, deployment="org/model", status=Status.RUNNING, session=""):
    """A job this controller dispatched: in its store, and held by its recorder."""
    service.store.create(
        Job(id=job_id, user_id=1, model_key="k", deployment=deployment, session_id=session)
    )
    path = [Status.QUEUED, Status.DISPATCHED, Status.RUNNING]
    for step in path[: path.index(status) + 1]:
        service.store.transition(job_id, step, step.value)
    return service.recorder.take(service.store.get(job_id))


def frames(service, session_id):
    queue = asyncio.run(service.bus.owner(session_id)).queue
    out = []
    while not queue.empty():
        out.append(JobUpdate.decode(queue.get_nowait()).model_dump())
    return out


BAD_EVENTS = [
    ("unknown job id", JobEvent("f" * 32, "COMPLETED", "forged")),
    ("job id that is not text", JobEvent(12345, "COMPLETED", "forged")),
    ("path in the job id", JobEvent("../../etc/passwd", "ERROR", "forged")),
    ("another deployment's job", JobEvent("other0", "COMPLETED", "forged")),
    ("a job still queued", JobEvent("queued0", "RUNNING", "forged")),
    ("a finished job", JobEvent("done0", "ERROR", "forged")),
    ("a status workers never send", JobEvent("victim0", "QUEUED", "back in line")),
    ("no such status", JobEvent("victim0", "PWNED", "")),
    ("status not text", JobEvent("victim0", ["COMPLETED"], "")),
    ("RUNNING -> RUNNING is no transition", JobEvent("victim0", "RUNNING", "again")),
    ("description not text", JobEvent("victim0", "ERROR", {"a": 1})),
    ("huge description", JobEvent("victim0", "ERROR", "x" * (2 * MiB))),
    ("meta not a table", JobEvent("victim0", "ERROR", "", meta=["runtime"])),
    ("meta not JSON", JobEvent("victim0", "ERROR", "", meta={"f": object()})),
    ("huge meta", JobEvent("victim0", "ERROR", "", meta={"pad": "x" * MiB})),
    ("runtime not a number", JobEvent("victim0", "COMPLETED", "", meta={"runtime": "-1e308"})),
    ("negative runtime", JobEvent("victim0", "COMPLETED", "", meta={"runtime": -5.0})),
    ("result size not a size", JobEvent("victim0", "COMPLETED", "", result_size="big")),
    ("not an event at all", {"job_id": "victim0", "status": "COMPLETED"}),
]


@pytest.mark.parametrize("what, event", BAD_EVENTS, ids=[what for what, _ in BAD_EVENTS])
def test_a_bad_event_is_dropped_and_logged_never_raised(service, what, event, caplog):
    running_job(service, "victim0")
    running_job(service, "other0", deployment="org/other")
    service.store.create(Job(id="queued0", user_id=1, model_key="k", deployment="org/model"))
    service.store.transition("queued0", Status.QUEUED, "waiting")
    running_job(service, "done0")
    service.recorder.record("done0", Status.COMPLETED, "done", result_size=1, result_expires_at=1e12)
    before = {job.id: (job.status, job.description) for job in service.store.search()}

    with caplog.at_level(logging.WARNING, logger="nnhost.jobs"):
        service.on_job_event("org/model", event)  # must not raise

    after = {job.id: (job.status, job.description) for job in service.store.search()}
    assert after == before, what
    assert "dropped an event" in caplog.text
    # The job it aimed at still takes its own worker's true events.
    service.results.write("victim0", b"the real result")
    service.on_job_event("org/model", JobEvent("victim0", "COMPLETED", "done", meta={"runtime": 1}))
    assert service.store.get("victim0").status is Status.COMPLETED


def test_a_forged_completion_of_a_dispatched_job_is_refused(service):
    running_job(service, "d0", status=Status.DISPATCHED)
    service.on_job_event("org/model", JobEvent("d0", "COMPLETED", "skipped RUNNING"))
    assert service.store.get("d0").status is Status.DISPATCHED
    service.on_job_event("org/model", JobEvent("d0", "RUNNING", "started"))
    assert service.store.get("d0").status is Status.RUNNING


def test_a_completion_takes_the_size_on_disk_not_the_reported_one(service):
    running_job(service, "r0")
    service.results.write("r0", b"12345")
    service.on_job_event("org/model", JobEvent("r0", "COMPLETED", "", result_size=10**15))
    assert service.store.get("r0").result_size == 5

    running_job(service, "r1")  # no result written: the report is false
    service.on_job_event("org/model", JobEvent("r1", "COMPLETED", "", result_size=5))
    job = service.store.get("r1")
    assert job.status is Status.ERROR and "none was written" in job.description


def test_text_sqlite_cannot_store_is_cleaned_not_raised(service):
    running_job(service, "s0")
    service.on_job_event("org/model", JobEvent("s0", "LOG", "half a pair: \ud800"))
    assert service.store.logs("s0") == ["half a pair: ?"]


def test_a_log_flood_leaves_at_most_the_cap_and_ends_with_one_notice(service, tmp_path):
    session = asyncio.run(service.bus.open(user_id=1))
    running_job(service, "flood0", session=session.id)
    line = "y" * 8191  # the longest line a worker sends; 12,800 of them are 100 MiB
    cap = service.settings.max_log_bytes
    for _ in range(100 * MiB // 8192):
        service.on_job_event("org/model", JobEvent("flood0", "LOG", line))
    stored = service.store.logs("flood0")
    *kept, notice = stored
    assert sum(len(text.encode()) for text in kept) <= cap
    assert len(kept) == cap // len(line)
    assert "dropped" in notice and "1 MiB" in notice
    sent = [frame["description"] for frame in frames(service, session.id)]
    assert sent == stored  # the client saw exactly what was kept, the notice last
    # The database holds about the cap, not 100 MiB.
    with service.store.database.read() as db:
        rows = db.execute(
            text("SELECT SUM(LENGTH(line)) FROM job_logs WHERE job_id = 'flood0'")
        ).scalar_one()
    assert rows <= cap + len(notice)


def test_the_line_cap_holds_too(tmp_path):
    settings = Settings(data_dir=tmp_path, max_log_lines=3)
    store = JobStore(connect(tmp_path / "db.sqlite3"))
    service = JobService(settings, store, LocalEventBus(), Scheduler(), Replicas(),
                         BlobDir(tmp_path / "p", ".p"), DirectoryStore(tmp_path / "r", LinkSigner(b"t")))
    running_job(service, "l0")
    for i in range(10):
        service.on_job_event("org/model", JobEvent("l0", "LOG", f"line {i}"))
    assert store.logs("l0")[:3] == ["line 0", "line 1", "line 2"]
    assert len(store.logs("l0")) == 4 and "at most 3 lines" in store.logs("l0")[3]


def test_no_job_stays_dispatched_or_running_past_its_limit(service):
    running_job(service, "hung0")  # RUNNING, its worker silent
    running_job(service, "lost0", status=Status.DISPATCHED)  # never started
    running_job(service, "fresh0")
    now = time.time()
    late = now + 60 + 5 + STUCK_MARGIN + 1
    assert service.sweep_stuck(now=now) == 0  # within the limit: left alone
    service.recorder.job("fresh0").updated_at = late - 1  # as if it had just reported
    assert service.sweep_stuck(now=late) == 2
    for job_id in ("hung0", "lost0"):
        job = service.store.get(job_id)
        assert job.status is Status.ERROR
        assert "time limit" in job.description and "resubmit" in job.description
    assert service.store.get("fresh0").status is Status.RUNNING
    assert sorted(service.deployments.cancelled) == [("org/model", "hung0"), ("org/model", "lost0")]
    # The worker's late word about a job already failed changes nothing.
    service.on_job_event("org/model", JobEvent("hung0", "COMPLETED", "too late"))
    assert service.store.get("hung0").status is Status.ERROR


def test_log_lines_go_with_the_result_at_retention(service):
    for job_id in ("kept0", "gone0", "failed0"):
        running_job(service, job_id)
        for i in range(3):
            service.on_job_event("org/model", JobEvent(job_id, "LOG", f"{job_id} {i}"))
    service.results.write("gone0", b"r")
    service.results.write("kept0", b"r")
    service.on_job_event("org/model", JobEvent("gone0", "COMPLETED", ""))
    service.on_job_event("org/model", JobEvent("kept0", "COMPLETED", ""))
    service.on_job_event("org/model", JobEvent("failed0", "ERROR", "boom"))
    retention = service.settings.result_retention
    with service.store.database.write() as db:
        db.execute(
            text("UPDATE jobs SET result_expires_at = :at WHERE id = 'gone0'"),
            {"at": time.time() - 1},
        )
    assert asyncio.run(service.sweep_results()) == 1
    assert service.store.logs("gone0") == []
    assert len(service.store.logs("kept0")) == 3 and len(service.store.logs("failed0")) == 3
    # A job that ended without a result keeps its lines as long as a result would stay.
    later = time.time() + retention + 60 + 5 + STUCK_MARGIN + 1
    asyncio.run(service.sweep_results(now=later))
    assert service.store.logs("failed0") == []

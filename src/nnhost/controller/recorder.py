"""Recording a job's change and telling whoever waits: the controller's one way to write a status.

Why it exists: the controller's parts (the job service, its result committer,
its upkeep) all move jobs, and each change must land the same way: written
to the job store, noted to the observers (the server log, metrics), then
published as a `update.JobUpdate` to the job's websocket session. Given to
each of them, it keeps the three steps together and in that order.

The store blocks on the database, and the controller's event loop must not
(every replica report, dispatch and websocket update waits on it). So a
change is made in two halves:

- at once, on the loop, to the controller's own view of its live jobs
  (`job`, `live`): while it holds its lease the controller is the only writer
  of the jobs it has taken on (`take`: accepted, recovered, cancelled), so what
  it decided is what the row will hold, and its next decision (is this
  replica's event one the job can take? is the job still waiting?) reads
  that, not a row a write has yet to reach;
- later, in order, in a worker thread: one writer (a task that hands the
  queued writes to `storage.blocking.run_blocking` a batch at a time, one
  batch in flight) calls the store, a batch in one transaction
  (`JobStore.apply`: a burst of LOG lines is one commit, not one per line),
  then notes and publishes each change that was stored. One queue for every
  job keeps each job's order (RUNNING, its LOG lines, COMPLETED) and loses
  nothing across jobs; publishing only after the write means a client told
  COMPLETED who then asks the API for the job finds it COMPLETED, and the
  observers count what was stored.

A write that fails is logged, with the job and the status it would have
stored, and neither noted nor published: nobody is told what the database
does not hold. It is tried again first when the failure may pass (the
database was unreachable); never when the store refused it (a transition the
row's lifecycle forbids, a job it does not hold). The view keeps the
controller's decision (what it did, a dispatch say, happened), so the row
lags it, and the job's later writes may be refused in turn, until the next
controller recovers from the rows. A graceful stop waits for every queued
write (`flush`). Off a loop (a thread of a test) a change is written at once.

It must never decide a job's status (its callers do), call the store on the
event loop, publish or note a change before the store holds it, nor frame
anything for a client (the API process that holds the websocket does that
from the update).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Optional, Union, Unpack

from ..jobs.bus import EventBus
from ..jobs.job import InvalidTransition, Job, Status
from ..jobs.observer import JobObserver, Observers
from ..jobs.store import Changes, JobStore, LogLine, Transition, change
from ..jobs.update import JobUpdate
from ..storage.blocking import run_blocking

log = logging.getLogger("nnhost.jobs")
#: How many writes one trip to a worker thread carries (a burst of LOG lines
#: costs one hop, not one each; its first line waits for at most this many).
BATCH = 64
#: Tries of a write whose failure may pass (a database that dropped the connection).
ATTEMPTS = 3
#: Seconds between those tries (in the writer's thread; later writes wait, in order).
RETRY_AFTER = 0.5


@dataclass(frozen=True)
class _Transition:
    job_id: str
    status: Status
    description: str
    inline: Optional[bytes]
    fields: Changes
    #: Where it was decided (an HTTP request's id, or none): its note is logged there.
    context: contextvars.Context = field(default_factory=contextvars.copy_context, compare=False)


@dataclass(frozen=True)
class _Line:
    job: Job
    line: str


_Write = Union[_Transition, _Line]
#: What a write came to: the job as stored (a transition), True (a LOG line), or None (failed).
_Outcome = Union[Job, bool, None]


class Recorder:
    def __init__(self, store: JobStore, bus: EventBus, observers: Iterable[JobObserver] = ()) -> None:
        self.store = store
        self.bus = bus
        #: Told of every recorded change (metrics); never of LOG lines.
        self.observers = Observers(observers)
        #: The controller's view of the jobs it has taken on and whose end is not yet stored.
        self._live: dict[str, Job] = {}
        #: Writes decided on the loop, not yet handed to the writer, oldest first.
        self._writes: deque[_Write] = deque()
        #: The one writer, while writes are queued or in flight.
        self._writer: Optional[asyncio.Task[None]] = None

    # -- the view --------------------------------------------------------------------

    def take(self, job: Job) -> Job:
        """From now on this controller writes ``job``'s row: its view of the job (a copy of
        ``job``, or the one it already holds, which is newer)."""
        held = self._live.get(job.id)
        if held is None:
            held = self._live[job.id] = dataclasses.replace(job)
        return held

    def job(self, job_id: str) -> Optional[Job]:
        """The job as this controller last decided it (read-only), or None if it holds no such job."""
        return self._live.get(job_id)

    def live(self, statuses: Iterable[Status]) -> list[Job]:
        """The jobs held at one of ``statuses``, oldest first (a list: recording may end them)."""
        wanted = set(statuses)
        return sorted((job for job in self._live.values() if job.status in wanted),
                      key=lambda job: job.created_at)

    # -- changes ---------------------------------------------------------------------

    def record(
        self, job_id: str, status: Status, description: str,
        inline: Optional[bytes] = None, **fields: Unpack[Changes],
    ) -> Job:
        """Change the job now (`InvalidTransition` if its lifecycle forbids it; `KeyError` if
        it was not taken on); the write, then the note and the update, follow in order."""
        job = self._live.get(job_id)
        if job is None:
            raise KeyError(job_id)
        change(job, status, description, **fields)
        self._queue(_Transition(job_id, status, description, inline, fields))
        return job

    def add_log(self, job: Job, line: str) -> None:
        """Store one of ``job``'s LOG lines, then publish it, after every change queued before."""
        # As the job is now: the update goes out later, when the view may have moved on.
        self._queue(_Line(dataclasses.replace(job), line))

    def publish(
        self, job: Job, status: Status, description: str, inline: Optional[bytes] = None
    ) -> None:
        """Push an update to the job's session (its API process frames it for the client)."""
        if not job.session_id:
            return
        update = JobUpdate(
            job_id=job.id, status=status.value, description=description, meta=job.meta,
            base_url=job.base_url,
            result_expires_at=job.result_expires_at if status is Status.COMPLETED else None,
            inline=inline if status is Status.COMPLETED else None,
        )
        self.bus.publish(job.session_id, update.encode())

    async def flush(self) -> None:
        """Return once every change recorded so far is written (or failed and logged), and
        told."""
        while self._writer is not None:
            writer = self._writer
            await asyncio.wait([writer])  # not cancelled with the caller: the writes go on
            if self._writer is writer:  # cancelled before it ran, so it could not say
                self._writer = None

    # -- the writer --------------------------------------------------------------------

    def _queue(self, write: _Write) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to keep free (a thread of a test): write it now
            self._told([write], self._write([write]))
            return
        self._writes.append(write)
        if self._writer is None:
            # Of no request: a task keeps the context it was made in, and one made
            # while a POST queued its job would log every later job's end as that POST's.
            self._writer = loop.create_task(self._drain(), context=contextvars.Context())

    async def _drain(self) -> None:
        try:
            while self._writes:
                batch = [self._writes.popleft() for _ in range(min(BATCH, len(self._writes)))]
                outcomes = await run_blocking(self._write, batch)
                self._told(batch, outcomes)
        finally:
            self._writer = None

    def _write(self, batch: list[_Write]) -> list[_Outcome]:
        """Blocking, in the writer's thread: the writes in order, in one transaction.

        A job's RUNNING and its burst of LOG lines then cost one commit, not
        one each. Should the transaction fail (the database, not a refusal),
        each write is tried on its own, with its retries.
        """
        if len(batch) > 1:
            try:
                applied = self.store.apply([_stored(write) for write in batch])
            except Exception:
                log.warning("could not store %d changes together; storing each on its own",
                            len(batch), exc_info=True)
            else:
                outcomes: list[_Outcome] = []
                for write, outcome in zip(batch, applied):
                    if isinstance(outcome, Exception):
                        self._refused(write, outcome)
                        outcomes.append(None)
                    else:
                        outcomes.append(outcome)
                return outcomes
        return [self._write_one(write) for write in batch]

    def _write_one(self, write: _Write) -> _Outcome:
        error: Optional[Exception] = None
        for attempt in range(1, ATTEMPTS + 1):
            try:
                if isinstance(write, _Line):
                    self.store.add_log(write.job.id, write.line)
                    return True
                return self.store.transition(
                    write.job_id, write.status, write.description, **write.fields
                )
            except (InvalidTransition, KeyError) as refused:
                error = refused
                break  # the store refused it: trying again cannot help
            except Exception as failure:
                error = failure
                if attempt == ATTEMPTS:
                    break
                log.warning("could not store a change of %s (try %d of %d); trying again",
                            _job_id(write), attempt, ATTEMPTS, exc_info=True)
                time.sleep(RETRY_AFTER)
        self._refused(write, error)
        return None

    def _refused(self, write: _Write, error: Optional[Exception]) -> None:
        """Say, with the job, what was not stored: it is never announced."""
        what = "a LOG line" if isinstance(write, _Line) else write.status.value
        log.error("could not store %s of job %s; it is not announced", what, _job_id(write),
                  exc_info=error, extra={"job_id": _job_id(write)})

    def _told(self, batch: list[_Write], outcomes: list[_Outcome]) -> None:
        """On the loop: note and publish what was stored, in order; let ended jobs go."""
        for write, outcome in zip(batch, outcomes):
            try:
                if isinstance(write, _Line):
                    if outcome:
                        self.publish(write.job, Status.LOG, write.line)
                    continue
                if isinstance(outcome, Job):
                    write.context.run(self.observers.noted, outcome)
                    self.publish(outcome, write.status, write.description, write.inline)
                held = self._live.get(write.job_id)
                if write.status.final and held is not None and held.status.final:
                    del self._live[write.job_id]  # nothing more is written of it
            except Exception:
                log.exception("could not announce a change of %s", _job_id(write))


def _stored(write: _Write) -> Union[Transition, LogLine]:
    if isinstance(write, _Line):
        return LogLine(write.job.id, write.line)
    return Transition(write.job_id, write.status, write.description, write.fields)


def _job_id(write: _Write) -> str:
    return write.job.id if isinstance(write, _Line) else write.job_id

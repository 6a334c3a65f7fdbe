"""Recording a job's change and telling whoever waits: the controller's one way to write a status.

Why it exists: the controller's parts (the job service, its result committer,
its upkeep) all move jobs, and each change must land the same way: written
to the job store, noted to the observers (the server log, metrics), then
published as a `update.JobUpdate` to the job's websocket session. Given to
each of them, it keeps the three steps together and in that order.

It runs on the controller's event loop. It must never decide a job's
status (its callers do) nor frame anything for a client (the API process
that holds the websocket does that from the update).
"""

from __future__ import annotations

from typing import Iterable, Optional, Unpack

from ..jobs.bus import EventBus
from ..jobs.job import Job, Status
from ..jobs.observer import JobObserver, Observers
from ..jobs.store import Changes, JobStore
from ..jobs.update import JobUpdate


class Recorder:
    def __init__(self, store: JobStore, bus: EventBus, observers: Iterable[JobObserver] = ()) -> None:
        self.store = store
        self.bus = bus
        #: Told of every recorded change (metrics); never of LOG lines.
        self.observers = Observers(observers)

    def record(
        self, job_id: str, status: Status, description: str,
        inline: Optional[bytes] = None, **fields: Unpack[Changes],
    ) -> Job:
        """Write the change, note it, and publish it to the job's session; the job as stored."""
        job = self.store.transition(job_id, status, description, **fields)
        self.observers.noted(job)
        self.publish(job, status, description, inline)
        return job

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

"""Storing a finished job's result, then announcing it: the job service's COMPLETED path.

Split from `service` so the lifecycle reads on its own. `Completion` is a
collaborator the job service holds: it is given the settings, the result
store, the `recorder.Recorder` (which writes the job, and whose view of it
says whether it ended meanwhile) and the service's ``finished`` (which
releases what the service keeps per job), and runs on the same event loop. The worker's file is committed to the result store before anything is
announced, and the size checked is the one the store holds. Storing is one blocking step (`_store_result`) that the result store's
loop side runs where its I/O belongs (`AsyncResultStore.run_then`): in place
for a local directory (a rename, done as the event arrives), in a thread for
S3, the job recorded when it returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import cached_property, partial
from typing import Any, Callable, Optional

from ..config import Settings
from ..jobs.job import Job, Status
from ..storage.results import AsyncResultStore, ResultStore
from ..units import format_size
from .recorder import Recorder

log = logging.getLogger("nnhost.jobs")
#: What storing a result came to: (stored size, bytes to send inline, whether it failed).
Outcome = tuple[Optional[int], Optional[bytes], bool]
#: What the job service does once a job of a deployment has ended (``finished(name, job_id)``).
Finished = Callable[[str, str], None]


class Completion:
    def __init__(
        self, settings: Settings, results: ResultStore, recorder: Recorder, finished: Finished,
    ) -> None:
        self.settings = settings
        self.results = results
        self._recorder = recorder
        self._finished = finished
        #: Results being committed to a remote store, by job id (see `complete`).
        self._storing: dict[str, asyncio.Task[None]] = {}

    @cached_property
    def _results_on_loop(self) -> AsyncResultStore:
        return self.results.on_loop()

    def storing(self, job_id: str) -> bool:
        """Whether ``job_id`` finished and its result is being stored (it will be recorded)."""
        return job_id in self._storing

    def complete(
        self, name: str, job: Job, description: str, meta: Optional[dict[str, Any]]
    ) -> None:
        """COMPLETED: commit the worker's file to the result store, then record and announce.

        The job stays RUNNING until the store holds its result, so a client
        told COMPLETED can always download it.
        """
        if job.id in self._storing:
            return  # already being stored (check_event lets no second COMPLETED through)

        work = partial(self._store_result, job_id=job.id, inline=bool(job.session_id))
        stored = partial(self._stored, name, job.id, description, meta)
        storing = self._results_on_loop.run_then(work, stored)
        if storing is not None:  # in a thread: the job is recorded when it is done
            self._storing[job.id] = storing
            storing.add_done_callback(lambda _: self._storing.pop(job.id, None))

    def _store_result(self, results: ResultStore, *, job_id: str, inline: bool) -> Outcome:
        """Blocking: (stored size, inline bytes, whether it failed)."""
        try:
            size = results.commit(job_id)
            limit = self.settings.max_result_bytes
            if size is not None and limit and size > limit:
                results.delete(job_id)
                return size, None, False
            data = None
            if inline and size is not None and size <= self.settings.inline_result_bytes:
                data = results.read(job_id)
            return size, data, False
        except Exception:
            log.exception("could not store the result of %s in %s", job_id, results.location)
            try:
                results.delete(job_id)
            except Exception:
                log.exception("could not remove the unstored result of %s", job_id)
            return None, None, True

    def _stored(
        self, name: str, job_id: str, description: str, meta: Optional[dict[str, Any]],
        outcome: Outcome,
    ) -> None:
        size, data, failed = outcome
        job = self._recorder.job(job_id)
        if job is None or job.status.final:
            # Cancelled or failed as stuck while its result was being stored: drop it.
            self._results_on_loop.run_then(partial(_drop_result, job_id=job_id), _nothing)
            self._finished(name, job_id)
            return
        limit = self.settings.max_result_bytes
        # The size the store holds, not the one reported: the report is the worker's word.
        if failed:
            self._recorder.record(job_id, Status.ERROR, (
                "Your request completed but its result could not be stored on this server. "
                "Please resubmit it; if this keeps happening, tell the operator."
            ), meta=meta)
        elif size is None:
            self._recorder.record(job_id, Status.ERROR, (
                "The worker reported a result but none was written. Please resubmit "
                "your request."
            ), meta=meta)
        elif limit and size > limit:
            self._recorder.record(job_id, Status.ERROR, (
                f"Your request's result ({format_size(size)}) is larger than this server "
                f"keeps ({format_size(limit)}). Save less, or smaller values."
            ), meta=meta)
        else:
            self._recorder.record(
                job_id, Status.COMPLETED, description, meta=meta, result_size=size,
                result_expires_at=time.time() + self.settings.result_retention, inline=data,
            )
        self._finished(name, job_id)

    async def settled(self) -> None:
        """Wait until no result is being stored (before a shutdown requeues jobs; in tests)."""
        while self._storing:
            await asyncio.gather(*list(self._storing.values()), return_exceptions=True)


def _drop_result(results: ResultStore, *, job_id: str) -> None:
    """Blocking: delete a result nobody will be told of (its failure is only logged)."""
    try:
        results.delete(job_id)
    except Exception:
        log.exception("could not delete the result of %s", job_id)


def _nothing(_: None) -> None:
    pass

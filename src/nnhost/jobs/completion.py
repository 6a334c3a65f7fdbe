"""Storing a finished job's result, then announcing it: the job service's COMPLETED path.

Split from `service` so the lifecycle reads on its own. `Completion` is a part
of `JobService` (it uses the service's settings, store and result store) and
runs on the same event loop. The worker's file is committed to the result
store before anything is announced, and the size checked is the one the store
holds. A remote store (S3) blocks on the network, so its calls run in a
thread and the job is recorded when they return; a local directory is a
rename and is done in place, as the event arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Unpack

from ..units import format_size
from .job import Job, Status

if TYPE_CHECKING:
    from ..config import Settings
    from ..storage.results import ResultStore
    from .store import Changes, JobStore

log = logging.getLogger("nnhost.jobs")
T = TypeVar("T")
#: What storing a result came to: (stored size, bytes to send inline, whether it failed).
Outcome = tuple[Optional[int], Optional[bytes], bool]


class Completion:
    # What it uses of `JobService` (which sets them), declared so each part is checked alone.
    settings: Settings
    store: JobStore
    results: ResultStore
    _storing: dict[str, asyncio.Task[None]]

    if TYPE_CHECKING:
        def _record(
            self, job_id: str, status: Status, description: str,
            inline: Optional[bytes] = None, **fields: Unpack[Changes],
        ) -> Job: ...

        def _finished(self, name: str, job_id: str, ran: bool = True) -> None: ...

    def _complete(
        self, name: str, job: Job, description: str, meta: Optional[dict[str, Any]]
    ) -> None:
        """COMPLETED: commit the worker's file to the result store, then record and announce.

        The job stays RUNNING until the store holds its result, so a client
        told COMPLETED can always download it.
        """
        inline = bool(job.session_id)
        if not self.results.remote:
            self._stored(name, job.id, description, meta, self._store_result(job.id, inline))
            return
        if job.id in self._storing:
            return  # already being stored (check_event lets no second COMPLETED through)

        async def store() -> None:
            try:
                outcome = await asyncio.to_thread(self._store_result, job.id, inline)
                self._stored(name, job.id, description, meta, outcome)
            except Exception:
                log.exception("could not record the result of %s", job.id)
            finally:
                self._storing.pop(job.id, None)

        self._storing[job.id] = asyncio.get_running_loop().create_task(store())

    def _store_result(self, job_id: str, inline: bool) -> Outcome:
        """Blocking (a thread's, for a remote store): (stored size, inline bytes, whether it failed)."""
        try:
            size = self.results.commit(job_id)
            limit = self.settings.max_result_bytes
            if size is not None and limit and size > limit:
                self.results.delete(job_id)
                return size, None, False
            data = None
            if inline and size is not None and size <= self.settings.inline_result_bytes:
                data = self.results.read(job_id)
            return size, data, False
        except Exception:
            log.exception("could not store the result of %s in %s", job_id, self.results.location)
            try:
                self.results.delete(job_id)
            except Exception:
                log.exception("could not remove the unstored result of %s", job_id)
            return None, None, True

    def _stored(
        self, name: str, job_id: str, description: str, meta: Optional[dict[str, Any]],
        outcome: Outcome,
    ) -> None:
        size, data, failed = outcome
        job = self.store.get(job_id)
        if job is None or job.status.final:
            # Cancelled or failed as stuck while its result was being stored: drop it.
            self._blocking_soon(self.results.delete, job_id)
            self._finished(name, job_id)
            return
        limit = self.settings.max_result_bytes
        # The size the store holds, not the one reported: the report is the worker's word.
        if failed:
            self._record(job_id, Status.ERROR, (
                "Your request completed but its result could not be stored on this server. "
                "Please resubmit it; if this keeps happening, tell the operator."
            ), meta=meta)
        elif size is None:
            self._record(job_id, Status.ERROR, (
                "The worker reported a result but none was written. Please resubmit "
                "your request."
            ), meta=meta)
        elif limit and size > limit:
            self._record(job_id, Status.ERROR, (
                f"Your request's result ({format_size(size)}) is larger than this server "
                f"keeps ({format_size(limit)}). Save less, or smaller values."
            ), meta=meta)
        else:
            self._record(
                job_id, Status.COMPLETED, description, meta=meta, result_size=size,
                result_expires_at=time.time() + self.settings.result_retention, inline=data,
            )
        self._finished(name, job_id)

    async def _blocking(self, call: Callable[..., T], *args: Any) -> T:
        """Run a result-store call: in a thread for a remote store, here for a local one."""
        if self.results.remote:
            return await asyncio.to_thread(call, *args)
        return call(*args)

    def _blocking_soon(self, call: Callable[..., Any], *args: Any) -> None:
        """`_blocking`, from synchronous code: a remote call is left to run on its own."""
        if not self.results.remote:
            call(*args)
            return

        async def run() -> None:
            try:
                await asyncio.to_thread(call, *args)
            except Exception:
                log.exception("result store call %s failed", getattr(call, "__name__", call))

        asyncio.get_running_loop().create_task(run())

    async def settled(self) -> None:
        """Wait until no result is being stored (before a shutdown requeues jobs; in tests)."""
        while self._storing:
            await asyncio.gather(*list(self._storing.values()), return_exceptions=True)

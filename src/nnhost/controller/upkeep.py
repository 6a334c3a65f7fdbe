"""The job service's upkeep: after a restart, before a shutdown, and on a timer.

Split from `service` so the lifecycle of one job reads on its own. `Upkeep`
is a collaborator the job service holds: it is given the stores, the
scheduler, the deployments, the `recorder.Recorder`, the service's
``finished`` and ``take_on_demand``, and the `completion.Completion` (a
shutdown waits for results being stored; the sweep spares a job whose result
is), and runs on the same event loop. It must never run a job twice: a job that may already have run is failed, not requeued,
unless the server itself stopped it before it could finish. Nor may it call a
store on the loop: recovery and the results sweep read and delete through
`run_blocking`, and the stuck sweep and the drain look at the recorder's view
of the live jobs (every job handed to a replica is one this controller took
on, and the view holds its latest status before the write lands).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

from ..config import Settings
from ..jobs.job import UNFINISHED, Job, Status
from ..jobs.store import JobStore
from ..storage.blocking import run_blocking
from ..storage.payloads import JobPayloads
from ..storage.results import ResultStore
from ..units import format_duration
from .completion import Completion, Finished
from .intake import LIVE_STATUSES
from .manager import DeploymentManager
from .recorder import Recorder
from .scheduler import Scheduler

log = logging.getLogger("nnhost.jobs")
#: Seconds past the time limit and kill grace before a silent job is failed.
STUCK_MARGIN = 15.0
#: Seconds a graceful shutdown waits, once no replica is busy, for the final
#: reports still on their way (within the shutdown's grace).
REPORTS_SETTLE = 5.0
#: Most seconds between two looks for stored results the database forgot (listing a bucket costs).
ORPHAN_SWEEP_SECONDS = 3600.0


class Upkeep:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        scheduler: Scheduler,
        deployments: DeploymentManager,
        payloads: JobPayloads,
        results: ResultStore,
        *,
        recorder: Recorder,
        completion: Completion,
        finished: Finished,
        take_on_demand: Callable[[Job], bool],
    ) -> None:
        self.settings = settings
        self.store = store
        self.scheduler = scheduler
        self.deployments = deployments
        self.payloads = payloads
        self.results = results
        self._recorder = recorder
        self._completion = completion
        self._finished = finished
        self._take_on_demand = take_on_demand
        #: Jobs a graceful shutdown stopped and put back in the queue: what their
        #: replicas still report of them is not recorded (the job service asks).
        self.requeued: set[str] = set()
        #: When `sweep_results` last looked for stored results the database forgot.
        self._orphans_swept = 0.0

    async def recover(self) -> list[str]:
        """After a restart or a takeover: requeue what had not started, fail what may have run.

        Returns the ids of the jobs put back in the queue. From here on this
        controller writes every job it found (`Recorder.take`).
        """
        requeued, lost = [], []
        for found, has_payload in await run_blocking(self._left_behind):
            job = self._recorder.take(found)
            name = job.deployment
            if job.status is Status.RUNNING or job.started_at is not None:
                reason = "The server restarted while your request was running."
            elif name not in self.deployments.deployments and not self._take_on_demand(job):
                reason = f"The server restarted and no longer serves {name}."
            elif not has_payload:
                reason = "The server restarted and your request's payload was lost."
            else:
                if job.status is Status.DISPATCHED:
                    self._recorder.record(job.id, Status.QUEUED, "Requeued after a server restart.")
                elif job.status is Status.RECEIVED:
                    # Stored by an API process, never queued: queued now, or dispatching it
                    # would be a transition its lifecycle forbids (RECEIVED to DISPATCHED).
                    self._recorder.record(job.id, Status.QUEUED, "Queued after a server restart.")
                self.scheduler.enqueue(name, job.user_id, job.id, priority=job.priority)
                requeued.append(job.id)
                continue
            # Never run twice what may already have run: the user decides.
            self._recorder.record(job.id, Status.ERROR, f"{reason} Please resubmit it.")
            lost.append(job.id)
        if lost:
            await run_blocking(self._delete_payloads, lost)
        return requeued

    def _left_behind(self) -> list[tuple[Job, bool]]:
        """Blocking: the jobs a previous controller left unfinished, each with whether its
        payload is here to run it (asked only of a job that has not started)."""
        return [
            (job, job.status is not Status.RUNNING and job.started_at is None
             and self._payload_here(job.id))
            for job in self.store.with_status(UNFINISHED)
        ]

    def _payload_here(self, job_id: str) -> bool:
        """Blocking: copy the payload to this machine now, in this thread, as the intake
        does for a new job: dispatching then finds the file and reads no database on
        the loop (a payload held in the database may be large)."""
        try:
            self.payloads.fetch_to_file(job_id)
        except (OSError, ValueError):
            return False
        return True

    def _delete_payloads(self, job_ids: list[str]) -> None:
        """Blocking: the payloads of jobs recovery failed."""
        for job_id in job_ids:
            self.payloads.delete(job_id)

    async def drain(self, grace: float) -> None:
        """Graceful shutdown: let running jobs finish, requeue the rest (the job service
        has stopped dispatching)."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(
            d.busy for d in self.deployments.deployments.values()
        ):
            await asyncio.sleep(0.1)
        # A replica frees itself just before its job's final report reaches this
        # loop: a job is not "stopped before it could finish" until its report had
        # a moment to be recorded (else it is requeued and, after the restart, runs
        # twice: seen under load in tests/test_roles.py).
        settle_until = min(deadline, time.monotonic() + REPORTS_SETTLE)
        while time.monotonic() < settle_until and self._recorder.live((Status.DISPATCHED, Status.RUNNING)):
            await asyncio.sleep(0.05)
        # A job whose result is being uploaded has finished: let it be recorded.
        await self._completion.settled()
        for job in self._recorder.live((Status.DISPATCHED, Status.RUNNING)):
            # Stopped before it could finish: it never completed, so it runs again
            # after the restart (back in the queue, it loses its started stamp).
            self.requeued.add(job.id)
            self._recorder.record(
                job.id, Status.QUEUED, "The server is restarting; your request will run again."
            )
        # Stored before the process goes: the next controller recovers from the rows.
        await self._recorder.flush()

    async def sweep_results(self, now: Optional[float] = None) -> int:
        """Delete results and LOG lines past their retention; returns how many results."""
        now = now or time.time()
        expired = [job.id for job in await run_blocking(self.store.expired_results, now)]
        # No line is written (nor result stored) later than the time limit and grace
        # after its job was dispatched (sweep_stuck sees to that), so anything older
        # than that plus the retention belongs to jobs that ended a retention ago.
        longest = self.settings.time_limit + self.settings.kill_grace + STUCK_MARGIN
        stale = now - self.settings.result_retention - longest
        # Now and then, results the database no longer knows of (a crash between
        # storing and recording one; a spool file of a job that never finished).
        orphans = now - self._orphans_swept >= min(ORPHAN_SWEEP_SECONDS, self.settings.result_retention)
        if orphans:
            self._orphans_swept = now
        deleted = await run_blocking(self._delete_results, expired, stale if orphans else None)
        await run_blocking(self._forget, deleted, stale)
        return len(deleted)

    def _forget(self, deleted: list[str], stale: float) -> None:
        """Blocking: the rows' side of deleted results, and LOG lines past their time.

        Beside the recorder's writer, not through it: these jobs have ended, so
        no change of theirs is queued for it to keep in order with.
        """
        for job_id in deleted:
            self.store.forget_result(job_id)
            self.store.delete_logs(job_id)  # a job's LOG lines go with its result
        # A job that ended without a result keeps its lines as long as a result would stay.
        self.store.delete_logs_before(stale)

    def _delete_results(self, job_ids: list[str], stale: Optional[float]) -> list[str]:
        """Blocking: delete these results (those that failed stay for the next sweep), then orphans."""
        deleted = []
        for job_id in job_ids:
            try:
                self.results.delete(job_id)
                deleted.append(job_id)
            except Exception:
                log.exception("could not delete the expired result of %s", job_id)
        if stale is not None:
            try:
                removed = self.results.expire(stale)
                if removed:
                    log.info("deleted %d results no job named any more", removed)
            except Exception:
                log.exception("could not sweep %s for forgotten results", self.results.location)
        return deleted

    def sweep_stuck(self, now: Optional[float] = None) -> int:
        """Fail jobs a replica holds past the time limit plus the kill grace; returns how many.

        A worker that died without a word, hung, or lies about its job must
        not leave the job DISPATCHED or RUNNING for ever: past its limit it is
        failed with an ERROR that says so, and its replica is told to stop it.
        Every job a replica holds was handed to it by this controller, so the
        recorder's view has them all, as last recorded (no database read).
        """
        now = time.time() if now is None else now
        allowed = self.settings.time_limit + self.settings.kill_grace + STUCK_MARGIN
        failed = 0
        for job in self._recorder.live(LIVE_STATUSES):
            if job.id in self.requeued or now - job.updated_at <= allowed:
                continue
            if self._completion.storing(job.id):
                continue  # it finished; its result is being uploaded, and will be recorded
            self._recorder.record(
                job.id,
                Status.ERROR,
                f"Your request was stopped: it stayed {job.status.value} for "
                f"{format_duration(now - job.updated_at)} without finishing, longer than this "
                f"server's time limit ({format_duration(self.settings.time_limit)}) and kill "
                "grace allow. Its worker may have hung or died. Please resubmit it.",
            )
            self._finished(job.deployment, job.id)  # it held its replica all that time
            failed += 1
            try:
                self.deployments.cancel(job.deployment, job.id)
            except Exception:
                log.exception("could not stop stuck job %s on %s", job.id, job.deployment)
        return failed

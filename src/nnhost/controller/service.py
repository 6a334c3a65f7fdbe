"""The lifecycle of jobs: accept, queue, dispatch, record, announce.

`JobService` is the controller's half (`front.JobFront` is the API's): a job
the front has stored (record and payload) is accepted here, queued fairly, handed
to an idle replica of its deployment, and every event the replica reports is
checked (a replica runs user code, so its events are untrusted: see
`intake`), recorded and then pushed to the job's websocket session. A
COMPLETED result is committed to the result store first (`Completion`), and
announced with the size the store holds. A job no replica finishes in time is
failed by `Upkeep.sweep_stuck`. Both are collaborators it builds and holds,
given exactly what they use, and every status is written through one
`recorder.Recorder`, whose view of the jobs it has taken on is what the
service reads: the job store blocks, so no method here calls it (the
recorder writes it in a worker thread, in order). It runs on the
controller's event loop only (replica events reach it through the
controller's loop, `inbox.Inbox`), so it needs no locks. It knows nothing of HTTP: what it publishes are `update.JobUpdate`
facts, which the API process holding the websocket frames for the client.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable, Optional, Union, Unpack

from ..config import Settings
from ..execution.events import JobEvent, JobSpec
from ..jobs.bus import EventBus
from ..jobs.job import NOT_STARTED, Job, Status
from ..jobs.observer import JobObserver
from ..jobs.store import Changes, JobStore
from ..jobs.text import clean_text
from ..models.adapters import UnknownAdapter, check_adapter
from ..storage.blocking import run_blocking
from ..storage.payloads import JobPayloads
from ..storage.results import ResultStore
from .completion import Completion
from .deployment import HOT, Deployment
from .intake import LogBudget, check_event, event_job_id
from .manager import CannotFit, DeploymentManager
from .on_demand import OnDemand
from .recorder import Recorder
from .scheduler import Scheduler
from .upkeep import Upkeep

log = logging.getLogger("nnhost.jobs")
#: How many times a deployment whose replicas all turned unhealthy is started
#: again for the jobs waiting for it before they end with an ERROR.
START_ATTEMPTS = 3


class JobService:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        bus: EventBus,
        scheduler: Scheduler,
        deployments: DeploymentManager,
        payloads: JobPayloads,
        results: ResultStore,
        observers: Iterable[JobObserver] = (),
        on_demand: Optional[OnDemand] = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.bus = bus
        self.scheduler = scheduler
        self.deployments = deployments
        self.payloads = payloads
        self.results = results
        #: Writes every change, notes it to the observers (metrics; never LOG lines), publishes it.
        self.recorder = Recorder(store, bus, observers)
        #: Commits a COMPLETED job's result to the result store before it is announced.
        self.completion = Completion(settings, results, self.recorder, self._finished)
        #: Payload deletions in flight, off the loop (`_drop_payload`).
        self._dropping: set[asyncio.Task[None]] = set()
        #: Recovery after a restart, the graceful drain, and the periodic sweeps.
        self.upkeep = Upkeep(
            settings, store, scheduler, deployments, payloads, results,
            recorder=self.recorder, completion=self.completion,
            finished=self._finished, take_on_demand=self.take_on_demand,
        )
        #: Set on graceful shutdown: nothing new is dispatched.
        self.draining = False
        #: Whether this process may still act as the controller (its lease is fresh):
        #: when it is not, nothing is dispatched, so a controller that stalled past
        #: its lease cannot hand out a job its successor also hands out.
        self.may_act: Callable[[], bool] = lambda: True
        #: What each waiting job was last told (its status, and its description near the
        #: head of the queue or its band of 25 further back), so unchanged news is not re-sent.
        self._announced: dict[str, tuple[Status, Union[str, int]]] = {}
        #: What each running job has printed so far, against the per-job caps.
        self.log_budget = LogBudget(settings.max_log_lines, settings.max_log_bytes)
        #: Fetches models ``[[allow]]`` permits (given by the controller when any are allowed).
        self.on_demand = on_demand

    # -- accepting -------------------------------------------------------------

    def accept(self, job: Job) -> None:
        """Queue a job the front has stored (RECEIVED, its payload written) and dispatch."""
        job = self.recorder.take(job)
        if job.status.final:
            return  # cancelled before it was queued
        if job.deployment not in self.deployments.deployments and not self.take_on_demand(job):
            self.reject(job, f"This server does not serve {job.deployment} (any longer).")
            return
        self.scheduler.enqueue(job.deployment, job.user_id, job.id, priority=job.priority)
        self._announce_positions(job.deployment, only=job.id)
        self.pump(job.deployment)

    def take_on_demand(self, job: Job) -> bool:
        """Whether ``job``'s model, not yet a deployment, was taken on by ``[[allow]]``
        (in the cache, or now being fetched)."""
        return self.on_demand is not None and self.on_demand.take(job.model_key) == job.deployment

    def reject(self, job: Job, reason: str) -> None:
        """End a stored job that cannot be queued, with ``reason`` as its ERROR."""
        self.recorder.take(job)
        self._record(job.id, Status.ERROR, reason)
        self._drop_payload(job.id)

    # -- dispatching -----------------------------------------------------------

    def has_work(self, name: str) -> bool:
        """Whether a deployment has jobs queued for it (it must not be evicted)."""
        return self.scheduler.has_work(name)

    def pump(self, name: str, now: Optional[float] = None) -> None:
        """Bring the deployment up if jobs wait for it, then hand them to idle replicas."""
        deployment = self.deployments.get(name)
        if self.scheduler.waiting(name) == 0 or not self.may_act():
            return
        if self.on_demand is not None and self.on_demand.fetching(name):
            self._announce_positions(name)  # how far its download has come
            return
        if deployment.unhealthy and deployment.failed_starts >= START_ATTEMPTS:
            # Started again and again, never serving: say so rather than wait for ever.
            # The next job submitted tries again.
            deployment.failed_starts = 0
            self._fail_waiting(name, cannot_start(deployment))
            return
        if deployment.target != "HOT" or deployment.unhealthy:
            # Say so first: the model is not up and memory is being found for it.
            self._announce_positions(name)
            try:
                self.deployments.request(name, HOT)
            except CannotFit as error:
                self._fail_waiting(name, str(error))
                return
        if deployment.ready:
            deployment.failed_starts = 0
        while deployment.ready and not self.draining:
            job_id = self.scheduler.next(name)
            if job_id is None:
                break
            self._announced.pop(job_id, None)
            job = self.recorder.job(job_id)
            if job is None or job.status.final:
                continue
            try:
                payload_path = self.payloads.fetch_to_file(job.id)
            except (OSError, ValueError) as error:
                log.error("the payload of %s cannot be read: %s", job.id, error)
                self.scheduler.finished(name, job.id, ran=False)
                self._record(job.id, Status.ERROR, (
                    "Your request's payload could not be read on this server. Please resubmit it."
                ))
                continue
            try:
                adapter = check_adapter(job.env, self.settings.hf_home)
            except UnknownAdapter as error:
                self.scheduler.finished(name, job.id, ran=False)
                self._record(job.id, Status.ERROR, str(error))
                continue
            spec = JobSpec(
                adapter_path=str(adapter) if adapter is not None else "",
                job_id=job.id,
                owner=str(job.user_id),
                payload_path=str(payload_path),
                compress=job.compress,
                env=job.env,
                client_python=job.client_python,
                runtime=job.client_version,
                result_path=str(self.results.staging_path(job.id)),
                time_limit=self.settings.time_limit,
                max_result_bytes=self.settings.max_result_bytes,
                max_log_lines=self.settings.max_log_lines,
            )
            self._record(job.id, Status.DISPATCHED, f"Dispatched to {name}.", started=True)
            try:
                self.deployments.submit(name, spec, more_waiting=self.scheduler.waiting(name) > 0)
            except RuntimeError as error:
                # The replica went away between the check and the send: wait again.
                log.warning("could not dispatch %s: %s", job.id, error)
                self._record(job.id, Status.QUEUED, "Waiting for the model to come back.")
                self.scheduler.enqueue(name, job.user_id, job.id, priority=job.priority)
                break
        self.grow(name, now)
        self._announce_positions(name)

    def grow(self, name: str, now: Optional[float] = None) -> None:
        """Start another replica of ``name`` once its oldest queued job has waited long enough."""
        waiting = self.scheduler.waiting(name)
        if not waiting or self.draining:
            return
        if self.scheduler.oldest_wait(name, now) >= self.settings.scale_up_after:
            self.deployments.grow(name, waiting)

    def pump_waiting(self, now: Optional[float] = None) -> None:
        """`pump` every deployment with a queue: the controller does every second, so a
        queue that waited long enough grows, and one left while it could not act moves."""
        for name in self.deployments.deployments:
            if self.scheduler.waiting(name):
                self.pump(name, now)

    def fetch_failed(self, name: str, reason: str) -> None:
        """A model fetched on demand cannot be had: its waiting jobs end with ``reason``."""
        self._fail_waiting(name, reason)

    def _fail_waiting(self, name: str, reason: str) -> None:
        while (job_id := self.scheduler.next(name)) is not None:
            self.scheduler.finished(name, job_id, ran=False)
            job = self.recorder.job(job_id)
            if job is not None and not job.status.final:
                self._record(job_id, Status.ERROR, reason)
                self._drop_payload(job_id)

    def _announce_positions(self, name: str, only: Optional[str] = None) -> None:
        """Tell waiting jobs where they stand: position and wait, or what the model is doing.

        Exact near the head of the queue; further back only when a job moves into
        a new band of 25, so a long queue costs a few writes per change, not one
        per waiting job.
        """
        deployment = self.deployments.get(name)
        positions = self.scheduler.positions(name)
        total = len(positions)
        # Each replica runs jobs_at_once of them side by side.
        lanes = max(1, deployment.count * deployment.jobs_at_once)
        mean = self.scheduler.mean_runtime(name)
        for job_id, position in positions.items():
            if only is not None and job_id != only:
                continue
            near = position <= 25
            where = f"position {position} of {total}" if near else f"about position {position // 25 * 25}"
            if self.on_demand is not None and self.on_demand.fetching(name):
                status = Status.QUEUED
                description = f"Waiting: {where}. {deployment.note}."
            elif deployment.target != "HOT":
                status = Status.PROVISIONING
                description = (
                    f"Waiting: {where}. {name} is not deployed; "
                    f"{deployment.note or 'finding memory for it'}."
                )
            elif deployment.loading and not deployment.healthy:
                status = Status.DEPLOYING
                description = (
                    f"Waiting: {where}. {deployment.note or f'Deploying {name}'}: "
                    "loading its weights."
                )
            else:
                status = Status.QUEUED
                ahead = position - 1 + deployment.running
                wait = mean * ahead / lanes
                estimate = f"estimated wait {wait:.0f}s" if wait >= 1 else "starting shortly"
                description = f"Waiting in queue: {where} for {name}; {estimate}."
            key = (status, description if near else position // 25)
            if self._announced.get(job_id) == key:
                continue
            self._announced[job_id] = key
            job = self.recorder.job(job_id)
            if job is not None and not job.status.final:
                self._record(job_id, status, description)

    # -- replica events ----------------------------------------------------------

    def on_job_event(self, name: str, event: JobEvent) -> None:
        """Record what a replica of ``name`` reports; a bad event is dropped and logged, never raised."""
        try:
            self._take_event(name, event)
        except Exception:
            log.exception("dropped an event from %s that could not be recorded", name)

    def _take_event(self, name: str, event: JobEvent) -> None:
        job_id = event_job_id(event)
        if job_id is not None and job_id in self.upkeep.requeued:
            return  # stopped by a graceful shutdown and already back in the queue
        if job_id is not None and event.status == Status.LOG.value and self.log_budget.spent(job_id):
            return  # past its budget: dropped before it costs a look
        # The job as this controller last recorded it, whether or not the write has landed
        # (an event of a job it does not hold, or no longer, is not known).
        job = self.recorder.job(job_id) if job_id is not None else None
        problem = check_event(event, job, name)
        if problem is not None:
            log.warning("dropped an event from a replica of %s: %s", name, problem)
            return
        assert job is not None  # check_event refuses an event that names no known job
        status = Status(event.status)
        description = clean_text(event.description)
        if status is Status.LOG:
            for line in self.log_budget.admit(job.id, description):
                self.recorder.add_log(job, line)
            return
        if status is Status.COMPLETED:
            self.completion.complete(name, job, description, event.meta)
            return
        self._record(job.id, status, description, meta=event.meta)
        if status.final:
            self._finished(name, job.id)

    def _finished(self, name: str, job_id: str, ran: bool = True) -> None:
        self._announced.pop(job_id, None)
        self.log_budget.forget(job_id)
        self._drop_payload(job_id)
        self.scheduler.finished(name, job_id, ran)

    def on_change(self, name: str) -> None:
        """A deployment changed state or a replica became idle: dispatch, re-announce."""
        self.pump(name)
        # Capacity may have been freed for models waiting on the same memory.
        for other in self.deployments.deployments:
            if other != name and self.scheduler.waiting(other):
                self.pump(other)

    # -- cancelling ----------------------------------------------------------------

    def cancel(self, job: Job) -> bool:
        """Cancel a waiting or running job; False if it had already ended."""
        job = self.recorder.job(job.id) or job  # what the caller read may be behind
        if job.status.final:
            return False
        job = self.recorder.take(job)
        if self.scheduler.remove(job.deployment, job.id) or job.status in NOT_STARTED:
            self._announced.pop(job.id, None)
            self._record(job.id, Status.ERROR, "Your request was cancelled while it was queued.")
            self._drop_payload(job.id)
            self._announce_positions(job.deployment)
            return True
        if self.deployments.cancel(job.deployment, job.id):
            return True  # the replica reports the ERROR once its worker is stopped
        self._record(job.id, Status.ERROR, "Your request was cancelled.")
        return True

    # -- upkeep (`upkeep.Upkeep`) ---------------------------------------------------

    async def recover(self) -> list[str]:
        """After a restart or a takeover: requeue what had not started, fail what may have run;
        the ids of the jobs put back in the queue."""
        return await self.upkeep.recover()

    async def drain(self, grace: float) -> None:
        """Graceful shutdown: stop dispatching, let running jobs finish, requeue the rest."""
        self.draining = True
        await self.upkeep.drain(grace)

    async def sweep_results(self, now: Optional[float] = None) -> int:
        """Delete results and LOG lines past their retention; returns how many results."""
        return await self.upkeep.sweep_results(now)

    def sweep_stuck(self, now: Optional[float] = None) -> int:
        """Fail jobs a replica holds past the time limit plus the kill grace; returns how many."""
        return self.upkeep.sweep_stuck(now)

    async def settled(self) -> None:
        """Wait until no result is being stored, no change is left to write, nor payload
        deleted (before a shutdown requeues jobs; in tests)."""
        await self.completion.settled()
        await self.recorder.flush()
        while self._dropping:
            await asyncio.gather(*list(self._dropping), return_exceptions=True)

    def _drop_payload(self, job_id: str) -> None:
        """Delete an ended job's payload in a thread: a file, and with split roles a database row.

        The payload store is blocking (`JobPayloads`); on the controller's loop
        every job's end would otherwise wait for its unlink or its write.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on a loop (a thread of a test): nothing to keep free
            _delete_payload(self.payloads, job_id)
            return
        task = loop.create_task(run_blocking(_delete_payload, self.payloads, job_id))
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)

    # -- recording -----------------------------------------------------------------

    def _record(
        self, job_id: str, status: Status, description: str,
        inline: Optional[bytes] = None, **fields: Unpack[Changes],
    ) -> Job:
        return self.recorder.record(job_id, status, description, inline, **fields)


def _delete_payload(payloads: JobPayloads, job_id: str) -> None:
    """Blocking: a payload nobody will read again; a failure to delete it is only logged."""
    try:
        payloads.delete(job_id)
    except Exception:
        log.exception("could not delete the payload of %s", job_id)


def cannot_start(deployment: Deployment) -> str:
    """The ERROR for jobs whose model was started `START_ATTEMPTS` times and never served."""
    why = next((r.health().description.strip() for r in deployment.replicas if r.health().description), "")
    first = why.splitlines()[0][:300] if why else "its replicas became unhealthy"
    return (
        f"{deployment.name} could not be started ({START_ATTEMPTS} attempts): {first} "
        "The server's log says more. You can resubmit your request; the model is tried again then."
    )

"""The lifecycle of jobs: accept, queue, dispatch, record, announce.

`JobService` is where the parts meet: a submitted job is written to the store
(and its payload to disk) before anything is announced, queued fairly, handed
to an idle replica of its deployment, and every event the replica reports is
recorded and then pushed to the job's websocket session. It runs on the API's
event loop only (the deployment manager hops replica callbacks onto it), so it
needs no locks. It knows nothing of HTTP: the API layer turns its results and
exceptions into responses.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Optional

from ..auth.keys import Principal
from ..config import Settings
from ..deployments.catalog import ModelKey
from ..deployments.manager import DeploymentManager
from ..execution.events import JobEvent, JobSpec
from ..storage.results import BlobDir, LinkSigner
from ..wire import Response
from .events import EventBus
from .job import Job, Status
from .scheduler import Scheduler
from .store import JobStore

log = logging.getLogger("nnhost.jobs")


class UnknownModel(LookupError):
    """The request names a model this server does not serve."""


class SessionNotOwned(PermissionError):
    """The request names a websocket session that is not the caller's."""


@dataclass
class Submission:
    model_key: str
    session_id: str
    compress: bool
    env: dict


class JobService:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        bus: EventBus,
        scheduler: Scheduler,
        deployments: DeploymentManager,
        payloads: BlobDir,
        results: BlobDir,
        signer: LinkSigner,
    ) -> None:
        self.settings = settings
        self.store = store
        self.bus = bus
        self.scheduler = scheduler
        self.deployments = deployments
        self.payloads = payloads
        self.results = results
        self.signer = signer

    # -- accepting -------------------------------------------------------------

    async def submit(
        self, principal: Principal, submission: Submission, blob: bytes, base_url: str
    ) -> Job:
        key = ModelKey.parse(submission.model_key)
        deployment = self.deployments.match(key)
        if deployment is None:
            raise UnknownModel(
                f"This server does not serve {key.describe()}. "
                f"Models served here: {self.deployments.catalog.describe()}."
            )
        if submission.session_id:
            session = self.bus.owner(submission.session_id)
            if session is None or session.user_id != principal.user_id:
                raise SessionNotOwned(
                    "The request names a websocket session that is not open for your "
                    "API key. Open /subscribe with the same key first."
                )
        job = Job(
            id=uuid.uuid4().hex,
            user_id=principal.user_id,
            model_key=submission.model_key,
            deployment=deployment.name,
            session_id=submission.session_id,
            compress=submission.compress,
            env=submission.env,
            status=Status.RECEIVED,
            description=f"Your request for {deployment.name} was received.",
            base_url=base_url,
        )
        # The payload is on disk before the job exists, so a recorded job
        # always has what it needs to run.
        await asyncio.to_thread(self.payloads.write, job.id, blob)
        self.store.create(job)
        self.scheduler.enqueue(deployment.name, principal.user_id, job.id)
        self._announce_positions(deployment.name, only=job.id)
        self.pump(deployment.name)
        return job

    # -- dispatching -----------------------------------------------------------

    def pump(self, name: str) -> None:
        """Hand waiting jobs to the deployment while it has an idle replica."""
        deployment = self.deployments.get(name)
        moved = False
        while deployment.ready:
            job_id = self.scheduler.next(name)
            if job_id is None:
                break
            moved = True
            job = self.store.get(job_id)
            if job is None or job.status.final:
                continue
            spec = JobSpec(
                job_id=job.id,
                payload_path=str(self.payloads.path(job.id)),
                compress=job.compress,
                env=job.env,
                result_path=str(self.results.path(job.id)),
                time_limit=self.settings.time_limit,
                max_result_bytes=self.settings.max_result_bytes,
                max_log_lines=self.settings.max_log_lines,
            )
            self._record(job.id, Status.DISPATCHED, f"Dispatched to {name}.")
            try:
                self.deployments.submit(name, spec)
            except RuntimeError as error:
                # The replica went away between the check and the send: wait again.
                log.warning("could not dispatch %s: %s", job.id, error)
                self._record(job.id, Status.QUEUED, "Waiting for the model to come back.")
                self.scheduler.enqueue(name, job.user_id, job.id)
                break
        if moved:
            self._announce_positions(name)

    def _announce_positions(self, name: str, only: Optional[str] = None) -> None:
        positions = self.scheduler.positions(name)
        deployment = self.deployments.get(name)
        total = len(positions)
        for job_id, position in positions.items():
            if only is not None and job_id != only:
                continue
            if deployment.state.state != "RUNNING":
                where = f"{name} is loading ({deployment.state.state.lower()})"
            elif deployment.replica.busy:
                where = f"{name} is busy with another request"
            else:
                where = f"{name} is about to take it"
            job = self.store.get(job_id)
            if job is None:
                continue
            description = f"Waiting in queue: position {position} of {total}; {where}."
            if job.status in (Status.RECEIVED, Status.QUEUED) and job.description != description:
                self._record(job_id, Status.QUEUED, description)

    # -- replica events ----------------------------------------------------------

    def on_job_event(self, name: str, event: JobEvent) -> None:
        job = self.store.get(event.job_id)
        if job is None or job.status.final:
            return
        status = Status(event.status)
        if status is Status.LOG:
            self.store.add_log(job.id, event.description)
            self._publish(job, Status.LOG, event.description)
            return
        if status is Status.COMPLETED:
            expires = time.time() + self.settings.result_retention
            self._record(
                job.id,
                status,
                event.description,
                meta=event.meta,
                result_size=event.result_size,
                result_expires_at=expires,
            )
        else:
            self._record(job.id, status, event.description, meta=event.meta)
        if status.final:
            self.payloads.delete(job.id)
            self._announce_positions(name)

    def on_ready(self, name: str) -> None:
        self.pump(name)

    # -- recording and announcing ------------------------------------------------

    def _record(self, job_id: str, status: Status, description: str, **fields) -> Job:
        job = self.store.transition(job_id, status, description, **fields)
        self._publish(job, status, description)
        return job

    def _publish(self, job: Job, status: Status, description: str) -> None:
        if not job.session_id:
            return
        if status is Status.COMPLETED:
            size = job.result_size or 0
            if size <= self.settings.inline_result_bytes and self.results.exists(job.id):
                frame = Response(
                    id=job.id,
                    status=status.value,
                    description=description,
                    data=self.results.read(job.id),
                    meta=job.meta,
                ).pickle()
                self.bus.publish(job.session_id, frame)
                return
        self.bus.publish(job.session_id, self.response(job, job.base_url, status, description).model_dump_json())

    def response(
        self,
        job: Job,
        base_url: str,
        status: Optional[Status] = None,
        description: Optional[str] = None,
    ) -> Response:
        """The Response a client sees for ``job`` (a link on COMPLETED)."""
        status = status or job.status
        data = None
        if status is Status.COMPLETED:
            data = self.result_url(job, base_url)
        meta = job.meta if status.final else None
        return Response(
            id=job.id,
            status=status.value,
            description=description if description is not None else job.description,
            data=data,
            meta=meta,
        )

    def result_url(self, job: Job, base_url: str) -> Optional[str]:
        if job.result_expires_at is None:
            return None
        base = (self.settings.public_url or base_url).rstrip("/")
        ttl = max(60.0, job.result_expires_at - time.time())
        return f"{base}/result/{job.id}?{self.signer.query(job.id, ttl)}"

    # -- housekeeping --------------------------------------------------------------

    def recover(self) -> None:
        """After a restart: requeue what was waiting, fail what was running."""
        waiting = (Status.RECEIVED, Status.QUEUED, Status.PROVISIONING, Status.DEPLOYING)
        for job in self.store.with_status(waiting + (Status.DISPATCHED, Status.RUNNING)):
            name = job.deployment
            known = name in self.deployments.deployments
            if job.status is Status.RUNNING or not known or not self.payloads.exists(job.id):
                reason = (
                    "The server restarted while your request was running."
                    if job.status is Status.RUNNING
                    else f"The server restarted and no longer serves {name}."
                    if not known
                    else "The server restarted and your request's payload was lost."
                )
                self.store.transition(job.id, Status.ERROR, f"{reason} Please resubmit it.")
                self.payloads.delete(job.id)
                continue
            if job.status is Status.DISPATCHED:
                self.store.transition(job.id, Status.QUEUED, "Requeued after a server restart.")
            self.scheduler.enqueue(name, job.user_id, job.id)

    def sweep_results(self, now: Optional[float] = None) -> int:
        """Delete results past their retention; returns how many."""
        expired = self.store.expired_results(now or time.time())
        for job in expired:
            self.results.delete(job.id)
            self.store.forget_result(job.id)
        return len(expired)

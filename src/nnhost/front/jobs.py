"""The job service as the routes see it, on every API process.

`JobFront` is what the API programs against: accept a request (its payload
and its record are stored before anything else happens, so an accepted job is
never lost), look jobs up, cancel them, read what the controller reports, and
ask the controller to act. It never dispatches or runs anything itself: it
tells the controller through a `ControllerLink`, which is the controller's
own `JobService` in this process (``role = "all"``), or the database
(`database_link.DatabaseLink`) when the controller is another process, perhaps on
another machine. It knows nothing of HTTP.

Its methods are coroutines and run on the event loop; the job store and the
payload store block (a database, a disk), so every call to them goes through
`storage.blocking.run_blocking`: a slow database holds one worker thread, not
every request and websocket of the process.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Protocol

from ..auth.keys import Principal
from ..jobs.bus import EventBus
from ..jobs.job import Job, Status
from ..jobs.messages import Board, Command, MalformedMessage, Refused, Result, parse_command
from ..jobs.observer import JobObserver, Observers
from ..jobs.store import JobStore
from ..models.catalog import Catalog, ModelKey, canonical_class
from ..storage.blocking import run_blocking
from ..storage.payloads import JobPayloads


class UnknownModel(LookupError):
    """The request names a model this server does not serve."""


class SessionNotOwned(PermissionError):
    """The request names a websocket session that is not the caller's."""


@dataclass
class Submission:
    model_key: str
    session_id: str
    compress: bool
    env: dict[str, Any]
    #: The Python the client ran on (`api.deps.client_python`), empty if unknown.
    client_python: str = ""
    #: The served nnsight version the client's matched (`api.deps.client_version`).
    client_version: str = ""


class ControllerLink(Protocol):
    """How an API process reaches the controller, wherever it runs."""

    def accepted(self, job: Job) -> None:
        """A job was stored and waits to be queued."""

    async def cancel(self, job: Job) -> bool:
        """Cancel a job that has not ended; False if it had."""

    async def command(self, command: Command) -> Result:
        """A checked command (`messages.Command`): the controller's result, or `Refused`."""

    def board(self) -> Board:
        """What the controller last reported (`board.board`): models, queues, devices."""


class JobFront:
    def __init__(
        self,
        store: JobStore,
        bus: EventBus,
        payloads: JobPayloads,
        catalog: Catalog,
        link: ControllerLink,
        observers: Iterable[JobObserver] = (),
    ) -> None:
        self.store = store
        self.bus = bus
        self.payloads = payloads
        self.catalog = catalog
        self.link = link
        self.observers = Observers(observers)

    async def submit(
        self, principal: Principal, submission: Submission, blob: bytes, base_url: str
    ) -> Job:
        self._check_model_class(submission.model_key)
        key = ModelKey.parse(submission.model_key)
        spec = self.catalog.match(key)
        rule = self.catalog.allowance(key) if spec is None else None
        if rule is not None and rule.spec(key).name not in self.catalog.specs:
            # Not served yet, but allowed: the controller fetches it (`controller.on_demand`).
            # (A name already served under another task or class is not a second deployment.)
            spec = rule.spec(key)
        if spec is None:
            raise UnknownModel(
                f"This server does not serve {key.describe()}, and no [[allow]] entry lets it "
                f"fetch it. Models served here: {self.catalog.describe()}."
            )
        if submission.session_id:
            session = await self.bus.owner(submission.session_id)
            if session is None or not (session.anyone or session.user_id == principal.user_id):
                raise SessionNotOwned(
                    "The request names a websocket session that is not open for your "
                    "API key. Open /subscribe with the same key first."
                )
        job = Job(
            id=uuid.uuid4().hex,
            user_id=principal.user_id,
            model_key=submission.model_key,
            deployment=spec.name,
            session_id=submission.session_id,
            compress=submission.compress,
            env=submission.env,
            client_python=submission.client_python,
            client_version=submission.client_version,
            status=Status.RECEIVED,
            description=f"Your request for {spec.name} was received.",
            base_url=base_url,
            priority="priority" in principal.tags,
        )
        def store() -> None:
            # The payload is stored before the job exists, so a recorded job always
            # has what it needs to run, whichever controller picks it up.
            self.payloads.write(job.id, blob)
            self.store.create(job)

        await run_blocking(store)  # one trip to a worker thread for both
        self.observers.noted(job)
        self.link.accepted(job)
        return job  # as accepted: the answer to the request is RECEIVED (PROTOCOL.md)

    def _check_model_class(self, model_key: str) -> None:
        """Refuse a key whose wrapper class no deployment here is loaded as.

        Checked before the key's own part is parsed: only nnsight's transformers
        and diffusers wrappers key themselves with JSON, so a class such as
        ``VLLM`` (keyed by a bare repo id) would otherwise be told its key is
        malformed, when the truth is that no engine for it runs here.
        """
        if not isinstance(model_key, str) or ":" not in model_key:
            return  # malformed: ModelKey.parse says how
        model_class = canonical_class(model_key.split(":", 1)[0])
        served = sorted({spec.model_class for spec in self.catalog}
                        | {rule.model_class for rule in self.catalog.allowed})
        if model_class in served:
            return
        names = ", ".join(name.rsplit(".", 1)[-1] for name in served) or "none"
        raise UnknownModel(
            f"This server does not run nnsight's {model_class.rsplit('.', 1)[-1]} models "
            f"({model_class}): no engine for them is configured here. It serves models "
            f"loaded as {names}: {self.catalog.describe()}."
        )

    # -- reading ---------------------------------------------------------------

    async def get(self, job_id: str) -> Optional[Job]:
        return await run_blocking(self.store.get, job_id)

    async def logs(self, job_id: str) -> list[str]:
        return await run_blocking(self.store.logs, job_id)

    async def for_user(self, user_id: int, limit: int = 50) -> list[Job]:
        return await run_blocking(self.store.for_user, user_id, limit)

    async def search(self, **filters: Any) -> list[Job]:
        return await run_blocking(self.store.search, **filters)

    async def with_status(self, statuses: Iterable[Status]) -> list[Job]:
        return await run_blocking(self.store.with_status, list(statuses))

    def board(self) -> Board:
        return self.link.board()

    # -- asking the controller ---------------------------------------------------

    async def cancel(self, job: Job) -> bool:
        if job.status.final:
            return False
        return await self.link.cancel(job)

    async def command(self, kind: str, **args: Any) -> dict[str, Any]:
        """``deploy`` (model, level) or ``evict`` (model): the controller's answer as JSON data,
        or `Refused` (400 for a command that is not one, before the controller is asked)."""
        try:
            command = parse_command(kind, args)
        except MalformedMessage as error:
            raise Refused(400, f"{error}.") from None
        return (await self.link.command(command)).model_dump()

"""The controller: its parts composed, and the one loop that drives them.

With ``role = "all"`` the API's lifespan builds one `Controller` and starts it
at once. With ``role = "controller"`` `run_controller` first waits for the
controller lease (`controller.lease`): a second controller started against the same
database stands by and takes over when the first stops renewing it. Either
way the controller recovers the jobs a previous one left (requeues what had
not started, fails what may have run), and then keeps them moving with one
control loop: each `Controller.tick` runs the periodic work in a fixed order
(reports, intake, commands, dispatch, scaling, sweep, publish; see `tick`),
in the spirit of Ray Serve's ``run_control_loop_step``. The replicas' and the
fetcher's reports reach it through a queue (`controller.inbox.Inbox`) that wakes
the loop as they arrive; with separate processes the loop also relays
(`controller.relay.Relay`: new jobs and commands from the database, the board to it).

`build_controller` builds the parts in dependency order (inbox, scheduler,
placement, deployments, fetcher, job service), each given what it uses. This
module must never speak HTTP nor decide a job's status itself (the job
service does); a controller that loses its lease stops at once, without
touching a job: another controller already acts.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, Optional

from ..config import Settings
from ..db import Database
from ..jobs.bus import EventBus, Session
from ..jobs.messages import PUBLISH_EVERY, WAKE, Board
from ..jobs.observer import JobObserver
from ..jobs.store import JobStore
from ..models.catalog import Catalog
from ..replicas.contract import PlacesOnNodes, ReplicaFactory
from ..replicas.factory import replica_factory, worker_environ
from ..storage.blocking import run_blocking
from ..storage.payloads import JobPayloads
from ..storage.results import ResultStore
from .board import board
from .devices import memory_budgets
from .inbox import Inbox
from .lease import RENEW_EVERY, Lease
from .manager import DeploymentManager
from .nodes import NodeRoom
from .placement import DeviceBudgets, Placement
from .relay import INTAKE_EVERY, Relay
from .scheduler import Scheduler
from .service import JobService

if TYPE_CHECKING:
    from ..telemetry.recent import RecentJobs

log = logging.getLogger("nnhost")

#: How often jobs past their time limit are looked for (and idle extra replicas stopped).
STUCK_SWEEP_SECONDS = 5.0
#: How often queues are looked at (a model that should grow another replica).
PUMP_SECONDS = 1.0


class Every:
    """A step's period: due when ``seconds`` have passed since it last ran."""

    def __init__(self, seconds: float, last: float = -math.inf) -> None:
        self.seconds = seconds
        self.last = last

    def due(self, now: float) -> bool:
        """Whether the step runs now (then it is counted as run)."""
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True

    def left(self, now: float) -> float:
        return max(0.0, self.last + self.seconds - now)


@dataclass
class Controller:
    settings: Settings
    deployments: DeploymentManager
    scheduler: Scheduler
    service: JobService
    #: Where the deployments and the fetcher post their reports (`controller.inbox`).
    inbox: Inbox = field(default_factory=Inbox)
    #: The recent-jobs history the board adds to each model (`telemetry.recent`).
    recent: Optional[RecentJobs] = None
    #: With separate processes: the database's side of the API (set by `start`).
    relay: Optional[Relay] = field(default=None, init=False)
    _loop: Optional[asyncio.Task[None]] = field(default=None, init=False)
    #: Steps that wait on I/O, by name, while one is in flight (one of each at a time).
    _pending: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False)
    #: An API process called (`messages.WAKE`): intake runs at the next tick.
    _woken: bool = field(default=False, init=False)
    #: Set by `stop`: the loop only takes in reports from then on.
    _stopping: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        # The first dispatch is a period after the start (the start itself pumps
        # what recovery requeued as deployments come up); every other step runs at once.
        self._dispatch = Every(PUMP_SECONDS, last=time.monotonic())
        self._sweep = Every(STUCK_SWEEP_SECONDS)
        self._results = Every(min(60.0, max(1.0, self.settings.result_retention / 4)))
        self._intake = Every(INTAKE_EVERY)
        self._publish = Every(PUBLISH_EVERY)

    def board(self) -> Board:
        recent = self.recent
        return board(
            self.service,
            summaries=getattr(recent, "summary", None),
            per_minute=recent.per_minute() if recent is not None else None,
        )

    async def start(self, database: Optional[Database] = None) -> list[str]:
        """Recover the jobs a previous controller left, bring the deployments up, and start
        the control loop; with ``database`` (separate processes) it relays through it too.

        Returns the ids of the jobs recovery put back in the queue.
        """
        requeued = await self.service.recover()
        self.deployments.start()
        if database is not None:
            self.relay = Relay(self.service, database, self.board, taken=set(requeued),
                               bus=self.service.bus)
        self._loop = asyncio.create_task(self.run())
        return requeued

    def stop_relaying(self) -> None:
        """No more intake, commands or board from this process (it is no longer the controller)."""
        self.relay = None
        for name in ("wake", "intake", "publish"):
            task = self._pending.pop(name, None)
            if task is not None:
                task.cancel()

    async def stop(self, grace: float) -> None:
        """Graceful shutdown: nothing new is dispatched, swept or relayed; running jobs may
        finish within ``grace`` (their reports are still taken in), the rest are requeued."""
        self._stopping = True
        self.stop_relaying()
        for task in self._pending.values():
            task.cancel()
        await self.service.drain(grace)
        if self.service.on_demand is not None:
            self.service.on_demand.close()
        await run_blocking(self.deployments.stop)
        # What the reports taken in meanwhile changed is stored before this returns.
        await self.service.settled()
        if self._loop is not None:
            self._loop.cancel()

    # -- the control loop ------------------------------------------------------------

    async def run(self) -> None:
        """Tick whenever a report arrives, an API process calls, or a step falls due."""
        wake = None
        if self.relay is not None and self.relay.bus is not None:
            wake = await self.relay.bus.listen(WAKE)
            self._pending["wake"] = asyncio.create_task(self._wakes(wake))
        while True:
            try:
                self.tick()
            except Exception:
                log.exception("a step of the controller's loop failed")
            await self.inbox.wait(self._next_due())

    def tick(self, now: Optional[float] = None) -> None:
        """One step of the control loop. In this order, each when it is due:

        1. reports: every report the replicas and the fetcher posted since the
           last tick, oldest first (job events, state changes and idle
           replicas, downloads), to the job service; always;
        2. intake: with separate processes, the jobs API processes stored in
           the database, when one called or every `relay.INTAKE_EVERY`;
        3. operator commands, with the intake (cancel, deploy, evict);
        4. dispatch: every queue is pumped (`PUMP_SECONDS`), so one that waited
           long enough grows, and one left while this process could not act
           moves (a new job or a freed replica dispatches at once, in 1-3);
        5. scaling: extra replicas idle long enough stop (`STUCK_SWEEP_SECONDS`);
        6. sweep: jobs past their time limit fail (the same period); expired
           results are deleted (a quarter of the retention, at most a minute);
        7. publish: with separate processes, the board (`messages.PUBLISH_EVERY`).

        While the controller stops, only 1 runs. A step that waits on I/O (the
        intake's payload copies and the commands, deleting results, writing the
        board) runs as a task, one of each at a time, so a slow database or
        bucket never holds up the reports; a step that fails is logged and the
        next one runs.
        """
        now = time.monotonic() if now is None else now
        self.inbox.drain(self.service)
        if self._stopping:
            return
        relay = self.relay
        if relay is not None and (self._woken or self._intake.due(now)) and "intake" not in self._pending:
            self._woken = False
            self._start("intake", lambda: self._take_in(relay))
        if self._dispatch.due(now):
            self._step("could not move a waiting queue", self.service.pump_waiting)
        if self._sweep.due(now):
            self._step("job sweep failed", self._scale_and_sweep)
        if self._results.due(now):
            self._start("results", self._sweep_results)
        if relay is not None and self._publish.due(now):
            self._start("publish", lambda: run_blocking(relay.publish, self.board()))

    def _next_due(self) -> Optional[float]:
        if self._stopping:
            return None
        now = time.monotonic()
        steps = [self._dispatch, self._sweep, self._results]
        if self.relay is not None:
            steps += [self._intake, self._publish]
        return min(step.left(now) for step in steps)

    @staticmethod
    def _step(failure: str, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception:
            log.exception(failure)

    def _start(self, name: str, work: Callable[[], Awaitable[object]]) -> None:
        """Run an I/O step as a task, unless one of its kind is in flight."""
        if name in self._pending:
            return

        async def step() -> None:
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the controller's %s step failed; trying again", name)

        task = asyncio.create_task(step())
        self._pending[name] = task

        def done(_: asyncio.Task[None]) -> None:
            if self._pending.get(name) is task:
                del self._pending[name]
            self.inbox.nudge()  # a wake that came meanwhile runs the step again now

        task.add_done_callback(done)

    def _scale_and_sweep(self) -> None:
        # No job stays DISPATCHED or RUNNING past its limit, whatever its worker says.
        for name in self.deployments.shrink():
            log.info("stopped idle extra replica %s", name)
        stuck = self.service.sweep_stuck() if self.service.may_act() else 0
        if stuck:
            log.warning("failed %d jobs that ran past their time limit", stuck)

    async def _sweep_results(self) -> None:
        removed = await self.service.sweep_results()
        if removed:
            log.info("deleted %d expired results", removed)

    @staticmethod
    async def _take_in(relay: Relay) -> None:
        await relay.intake()
        await relay.carry_out_commands()

    async def _wakes(self, wake: Session) -> None:
        while True:
            await wake.next()
            while not wake.queue.empty():  # one look serves every call made meanwhile
                wake.queue.get_nowait()
            self._woken = True
            self.inbox.nudge()


def placement_for(factory: ReplicaFactory, budgets: dict[str, int]) -> Placement:
    """Room per node when ``factory`` places replicas on a cluster's nodes (`nodes.NodeRoom`);
    else this machine's device ``budgets`` (`placement.DeviceBudgets`)."""
    if isinstance(factory, PlacesOnNodes):
        return NodeRoom(factory)
    return DeviceBudgets(budgets)


def build_controller(
    settings: Settings,
    catalog: Catalog,
    store: JobStore,
    bus: EventBus,
    payloads: JobPayloads,
    results: ResultStore,
    observers: list[JobObserver],
    recent: Optional[RecentJobs] = None,
) -> Controller:

    loop = asyncio.get_running_loop()
    # Built in dependency order. The manager and the fetcher post their reports to
    # the inbox, which the controller's loop hands to the job service; the manager
    # asks the scheduler (built first) whether a deployment has work.
    inbox = Inbox()
    scheduler = Scheduler()
    factory = replica_factory(settings)
    # On a cluster, room is per node, from what Ray reports (controller.nodes).
    budgets = memory_budgets(settings, catalog) if not settings.cluster else {}
    deployments = DeploymentManager(
        catalog,
        loop=loop,
        on_job_event=inbox.job_event,
        on_change=inbox.changed,
        has_work=scheduler.has_work,
        worker_environ=worker_environ(settings, catalog),
        placement=placement_for(factory, budgets),
        replica_factory=factory,
        torch_threads=settings.torch_threads,
        jobs_at_once=settings.jobs_at_once,
        jobs_per_process=settings.jobs_per_process,
        kill_grace=settings.kill_grace,
        scale_down_after=settings.scale_down_after,
    )
    on_demand = None
    if catalog.allowed:
        from ..models.downloader import HubDownloader
        from .on_demand import OnDemand

        on_demand = OnDemand(
            deployments,
            HubDownloader(settings.hf_home),
            loop=loop,
            budget=settings.download_budget,
            margin=settings.memory_margin,
            on_progress=inbox.fetch_progress,
            on_ready=inbox.changed,
            on_failed=inbox.fetch_failed,
        )
    service = JobService(settings, store, bus, scheduler, deployments, payloads, results,
                         observers=observers, on_demand=on_demand)
    return Controller(settings, deployments, scheduler, service, inbox, recent)


async def run_controller(
    lease: Lease,
    database: Database,
    build: Callable[[], Controller],
    on_acting: Callable[[Controller], None],
) -> None:
    """Stand by until this process holds the lease, then act as the controller until stopped."""
    waited = False
    while not await run_blocking(lease.try_acquire):
        if not waited:
            holder = await run_blocking(lease.current)
            log.info("standing by: the controller is %s", holder.holder if holder else "starting")
            waited = True
        await asyncio.sleep(RENEW_EVERY)
    log.info("this process (%s) is the controller now", lease.holder)
    renewed = time.monotonic()
    controller = build()
    # Fresh for a little less than the lease lasts: a stalled process stops acting
    # before a standby can have taken over (machines' clocks must agree within a second).
    controller.service.may_act = lambda: time.monotonic() - renewed < lease.ttl - RENEW_EVERY
    on_acting(controller)
    await controller.start(database)
    try:
        while True:
            await asyncio.sleep(RENEW_EVERY)
            try:
                held = await run_blocking(lease.renew)
            except Exception:
                log.exception("could not renew the controller lease")
                held = False
            if held or await run_blocking(lease.renew):
                renewed = time.monotonic()
            else:
                log.critical(
                    "this process lost the controller lease (another controller may act "
                    "now); stopping at once without touching a job"
                )
                # Its workers die with it (they watch their parent); nothing is recorded.
                logging.shutdown()
                os._exit(3)
    finally:
        controller.stop_relaying()

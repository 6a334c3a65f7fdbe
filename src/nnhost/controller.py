"""The controller's composition: the fair queue, the deployments and the replicas.

With ``role = "all"`` the API's lifespan builds one `Controller` and starts it
at once. With ``role = "controller"`` `run_controller` first waits for the
controller lease (`jobs.lease`): a second controller started against the same
database stands by and takes over when the first stops renewing it. Either
way the controller recovers the jobs a previous one left (requeues what had
not started, fails what may have run), and then keeps them moving: the
periodic sweep here, and with separate processes the `jobs.relay.Relay`
that takes new jobs and commands from the database and publishes the board.

A controller that loses its lease stops at once, without touching a job:
another controller already acts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from .config import Settings
from .db import Database
from .deployments.catalog import Catalog
from .deployments.contract import PlacesOnNodes, ReplicaFactory
from .deployments.manager import DeploymentManager
from .deployments.nodes import NodeRoom
from .deployments.placement import DeviceBudgets, Placement
from .jobs.board import board
from .jobs.bus import EventBus
from .jobs.inbox import Inbox
from .jobs.lease import RENEW_EVERY, Lease
from .jobs.observer import JobObserver
from .jobs.relay import Relay
from .jobs.scheduler import Scheduler
from .jobs.service import JobService
from .jobs.store import JobStore
from .storage.blocking import run_blocking
from .storage.payloads import JobPayloads
from .storage.results import ResultStore

if TYPE_CHECKING:
    from .telemetry.recent import RecentJobs

log = logging.getLogger("nnhost")

#: How often jobs past their time limit are looked for.
STUCK_SWEEP_SECONDS = 5.0
#: How often queues are looked at (a model that should grow another replica).
PUMP_SECONDS = 1.0


@dataclass
class Controller:
    settings: Settings
    deployments: DeploymentManager
    scheduler: Scheduler
    service: JobService
    #: The recent-jobs history the board adds to each model (`telemetry.recent`).
    recent: Optional[RecentJobs] = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def board(self) -> dict[str, Any]:
        recent = self.recent
        return board(
            self.service,
            summaries=getattr(recent, "summary", None),
            per_minute=recent.per_minute() if recent is not None else None,
        )

    def start(self) -> list[str]:
        """Recover the jobs a previous controller left, then bring the deployments up."""
        requeued = self.service.recover()
        self.deployments.start()
        self._tasks.append(asyncio.create_task(self._sweep()))
        self._tasks.append(asyncio.create_task(self._pump()))
        return requeued

    async def stop(self, grace: float) -> None:
        for task in self._tasks:
            task.cancel()
        await self.service.drain(grace)
        if self.service.on_demand is not None:
            self.service.on_demand.close()
        await run_blocking(self.deployments.stop)

    async def _pump(self) -> None:
        while True:
            await asyncio.sleep(PUMP_SECONDS)
            try:
                self.service.pump_waiting()
            except Exception:
                log.exception("could not move a waiting queue")

    async def _sweep(self) -> None:
        settings, loop = self.settings, asyncio.get_running_loop()
        every = min(60.0, max(1.0, settings.result_retention / 4))
        last = 0.0
        while True:
            try:
                # No job stays DISPATCHED or RUNNING past its limit, whatever its worker says.
                for name in self.deployments.shrink():
                    log.info("stopped idle extra replica %s", name)
                stuck = self.service.sweep_stuck() if self.service.may_act() else 0
                if stuck:
                    log.warning("failed %d jobs that ran past their time limit", stuck)
                if loop.time() - last >= every:
                    last = loop.time()
                    removed = await self.service.sweep_results()
                    if removed:
                        log.info("deleted %d expired results", removed)
            except Exception:
                log.exception("job sweep failed")
            await asyncio.sleep(STUCK_SWEEP_SECONDS)


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
    from .app import memory_budgets, replica_factory, worker_environ

    loop = asyncio.get_running_loop()
    # Built in dependency order. The manager and the fetcher report to the inbox,
    # which the job service is connected to once it exists; the manager asks the
    # scheduler (built first) whether a deployment has work.
    inbox = Inbox()
    scheduler = Scheduler()
    factory = replica_factory(settings)
    # On a cluster, room is per node, from what Ray reports (deployments.nodes).
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
        kill_grace=settings.kill_grace,
        scale_down_after=settings.scale_down_after,
    )
    on_demand = None
    if catalog.allowed:
        from .deployments.downloader import HubDownloader
        from .deployments.on_demand import OnDemand

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
    inbox.connect(service)
    return Controller(settings, deployments, scheduler, service, recent)


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
    taken = controller.start()
    relay = Relay(controller.service, database, controller.board, taken=set(taken),
                  bus=controller.service.bus)
    relaying = asyncio.create_task(relay.run())
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
        relaying.cancel()

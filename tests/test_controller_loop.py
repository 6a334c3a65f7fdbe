"""The controller's one loop: reports through the inbox, and each tick's steps in their order.

In-process, no worker and no HTTP. The parts are wired as `build_controller`
wires them (the manager and the job service never hold each other: the
manager posts to the inbox, the loop hands the reports to the service), with
`fakes.FakeFleet` where the replicas would be. A tick's order is checked on
recording stand-ins, the report path end to end on the real parts.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fakes import FakeFleet
from test_service_inprocess import ADA, spec, updates

from nnhost.config import Settings
from nnhost.controller.board import board
from nnhost.controller.inbox import Changed, FetchFailed, FetchMoved, Inbox, JobReported
from nnhost.controller.loop import Controller
from nnhost.controller.manager import DeploymentManager
from nnhost.controller.placement import DeviceBudgets
from nnhost.controller.relay import InProcessLink
from nnhost.controller.scheduler import Scheduler
from nnhost.controller.service import JobService
from nnhost.execution.events import JobEvent
from nnhost.front.jobs import JobFront, Submission
from nnhost.jobs.bus import LocalEventBus
from nnhost.jobs.job import Status
from nnhost.jobs.store import JobStore, connect
from nnhost.models.catalog import Catalog
from nnhost.storage.blobs import BlobDir
from nnhost.storage.links import LinkSigner
from nnhost.storage.results import DirectoryStore


class Composed:
    """The parts in `build_controller`'s order, on fake replicas."""

    def __init__(self, tmp_path, specs) -> None:
        self.settings = Settings(data_dir=tmp_path)
        self.fleet = FakeFleet()
        self.store = JobStore(connect(tmp_path / "jobs.sqlite3"))
        self.bus = LocalEventBus()
        self.catalog = Catalog(specs)
        payloads = BlobDir(tmp_path / "payloads", ".payload")
        inbox = Inbox()
        scheduler = Scheduler()
        deployments = DeploymentManager(
            self.catalog, loop=asyncio.get_running_loop(), on_job_event=inbox.job_event,
            on_change=inbox.changed, has_work=scheduler.has_work, worker_environ={},
            placement=DeviceBudgets({"cpu": 1 << 40}), replica_factory=self.fleet,
        )
        service = JobService(self.settings, self.store, self.bus, scheduler, deployments, payloads,
                             DirectoryStore(tmp_path / "results", LinkSigner(b"test")))
        self.controller = Controller(self.settings, deployments, scheduler, service, inbox)
        self.front = JobFront(self.store, self.bus, payloads, self.catalog,
                              link=InProcessLink(service, lambda: board(service)))

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0.005)

    async def submit(self, name: str, session: str = "") -> str:
        key = next(s for s in self.catalog if s.name == name).model_key()
        job = await self.front.submit(ADA, Submission(key, session, False, {}), b"payload", "http://x")
        await self.settle()
        return job.id


def test_replica_reports_reach_the_job_service_through_the_loop_in_order(tmp_path):
    async def body():
        world = Composed(tmp_path, [spec("org/a")])
        await world.controller.start()
        await world.settle()
        replica = world.fleet.latest("org/a")
        session = await world.bus.open(ADA.user_id)
        job_id = await world.submit("org/a", session.id)
        assert world.store.get(job_id).status is Status.DISPATCHED
        replica.run()
        replica.log("one")
        replica.log("two")
        replica.complete(b"r" * 10)
        # Posted, not handled: nothing runs the service's logic but the loop.
        assert world.store.get(job_id).status is Status.DISPATCHED
        await world.settle()
        job = world.store.get(job_id)
        assert job.status is Status.COMPLETED and job.result_size == 10
        assert world.store.logs(job_id) == ["one", "two"]
        told = [update.status for update in updates(session)]
        assert told == ["QUEUED", "DISPATCHED", "RUNNING", "LOG", "LOG", "COMPLETED"]
        assert len(world.controller.inbox) == 0
        await world.controller.stop(1.0)

    asyncio.run(body())


def test_a_graceful_stop_still_takes_in_the_report_of_a_job_finishing_meanwhile(tmp_path):
    async def body():
        world = Composed(tmp_path, [spec("org/a")])
        await world.controller.start()
        await world.settle()
        replica = world.fleet.latest("org/a")
        job_id = await world.submit("org/a")
        replica.run()
        await world.settle()
        stopping = asyncio.create_task(world.controller.stop(5.0))
        await world.settle()
        replica.complete()
        await stopping
        # It finished within the grace: recorded COMPLETED, not requeued to run again.
        assert world.store.get(job_id).status is Status.COMPLETED

    asyncio.run(body())


class Recording:
    """Stands in for the job service and the manager, writing down what a tick asks."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.on_demand = None
        self.bus = None

    def on_job_event(self, name, event):
        self.calls.append(f"event {name} {event.status}")

    def on_change(self, name):
        self.calls.append(f"change {name}")

    def pump(self, name, now=None):
        self.calls.append(f"progress {name}")

    def fetch_failed(self, name, reason):
        self.calls.append(f"failed {name}")

    def pump_waiting(self, now=None):
        self.calls.append("dispatch")

    def shrink(self, now=None):
        self.calls.append("scale")
        return []

    def may_act(self):
        return True

    def sweep_stuck(self, now=None):
        self.calls.append("sweep stuck")
        return 0

    async def sweep_results(self, now=None):
        self.calls.append("sweep results")
        return 0

    async def drain(self, grace):
        self.calls.append("drain")

    async def settled(self):
        self.calls.append("settled")

    def stop(self):
        self.calls.append("stop replicas")


def test_a_tick_runs_reports_then_dispatch_then_scaling_then_the_sweeps_each_when_due(tmp_path):
    async def body():
        parts = Recording()
        inbox = Inbox()
        controller = Controller(Settings(data_dir=tmp_path), parts, None, parts, inbox)
        start = time.monotonic()
        inbox.post(JobReported("org/a", JobEvent("j1", "RUNNING", "")))
        inbox.changed("org/b")
        inbox.fetch_progress("org/c")
        controller.tick(now=start + 1.0)
        await asyncio.sleep(0)  # the results sweep is a task of its own
        assert parts.calls == [
            "event org/a RUNNING", "change org/b", "progress org/c",
            "dispatch", "scale", "sweep stuck", "sweep results",
        ]
        parts.calls.clear()
        inbox.fetch_failed("org/c", "gone")
        controller.tick(now=start + 1.5)  # nothing else is due yet
        await asyncio.sleep(0)
        assert parts.calls == ["failed org/c"]
        parts.calls.clear()
        controller.tick(now=start + 2.0)
        assert parts.calls == ["dispatch"]
        parts.calls.clear()
        controller.tick(now=start + 6.0)
        assert parts.calls == ["dispatch", "scale", "sweep stuck"]
        parts.calls.clear()
        # Stopping: reports are still taken in, nothing else runs.
        await controller.stop(0)
        inbox.changed("org/a")
        controller.tick(now=start + 100.0)
        assert parts.calls == ["drain", "stop replicas", "settled", "change org/a"]

    asyncio.run(body())


def test_a_report_that_fails_is_logged_and_the_next_is_still_delivered(caplog):
    class Fussy:
        def __init__(self):
            self.changed = []

        def on_change(self, name):
            if name == "bad":
                raise RuntimeError("cannot")
            self.changed.append(name)

    async def body():
        inbox = Inbox()
        for name in ("a", "bad", "b"):
            inbox.post(Changed(name))
        handler = Fussy()
        with caplog.at_level(logging.ERROR, logger="nnhost.jobs"):
            assert inbox.drain(handler) == 3
        assert handler.changed == ["a", "b"]
        assert "could not take in Changed(name='bad')" in caplog.text
        assert len(inbox) == 0

    asyncio.run(body())


def test_the_loop_wakes_as_soon_as_a_report_is_posted():
    async def body():
        inbox = Inbox()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, inbox.post, FetchMoved("a"))
        # Woken by the post, not by the timeout: the two are minutes apart, so a
        # busy machine's delays cannot blur them.
        started = time.monotonic()
        await inbox.wait(600.0)
        assert time.monotonic() - started < 300.0 and len(inbox) == 1
        inbox.drain(Recording())
        started = time.monotonic()
        await inbox.wait(0.05)  # nothing posted: the timeout
        assert time.monotonic() - started >= 0.04
        inbox.post(FetchFailed("a", "x"))
        started = time.monotonic()
        await inbox.wait(600.0)  # already queued: at once
        assert time.monotonic() - started < 300.0

    asyncio.run(body())

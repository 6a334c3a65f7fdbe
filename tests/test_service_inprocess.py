"""The job service, the fair queue and the deployment manager, in-process, on fake replicas.

No worker process and no HTTP: the real `JobService`, `Scheduler`,
`DeploymentManager`, job store (SQLite in a temporary directory), event bus
and metrics observer, with `fakes.FakeFleet` as the manager's replica factory.
The test plays the worker by hand, so every ordering (a job finishing while
another waits, a worker dying mid-job, a forged event) is exact and fast.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fakes import FakeFleet

from nnhost.auth.keys import Principal
from nnhost.config import ModelEntry, Settings
from nnhost.controller.board import board
from nnhost.controller.loop import placement_for
from nnhost.controller.manager import DeploymentManager
from nnhost.controller.relay import InProcessLink
from nnhost.controller.scheduler import Scheduler
from nnhost.controller.service import JobService
from nnhost.execution.events import JobEvent
from nnhost.front.jobs import JobFront, Submission
from nnhost.jobs.bus import LocalEventBus
from nnhost.jobs.job import Status
from nnhost.jobs.store import JobStore, connect
from nnhost.jobs.update import JobUpdate
from nnhost.models.catalog import Catalog, ModelSpec
from nnhost.replicas.contract import Level, ReplicaStatus
from nnhost.replicas.incidents import Incident
from nnhost.storage.blobs import BlobDir
from nnhost.storage.links import LinkSigner
from nnhost.storage.results import DirectoryStore
from nnhost.telemetry.metrics import Metrics

MiB = 1 << 20
ADA, BOB = Principal(1, "ada@example.org"), Principal(2, "bob@example.org")


class World:
    """Every part the composition root builds, with fakes where the processes would be."""

    def __init__(self, tmp_path, specs, budgets=None, results=None, fleet=None, clock=time.monotonic,
                 **settings) -> None:
        self.loop = asyncio.get_running_loop()
        self.settings = Settings(data_dir=tmp_path, **settings)
        self.fleet = fleet or FakeFleet()
        self.connection = connect(tmp_path / "jobs.sqlite3")
        self.store = JobStore(self.connection)
        self.bus = LocalEventBus()
        self.scheduler = Scheduler(clock)
        self.payloads = BlobDir(tmp_path / "payloads", ".payload")
        self.results = results or DirectoryStore(tmp_path / "results", LinkSigner(b"test"))
        self.catalog = Catalog(specs)
        self.deployments = DeploymentManager(
            self.catalog, loop=self.loop,
            on_job_event=lambda name, event: self.jobs.on_job_event(name, event),
            on_change=lambda name: self.jobs.on_change(name),
            has_work=lambda name: self.jobs.has_work(name),
            worker_environ={}, placement=placement_for(self.fleet, budgets or {"cpu": 1 << 40}),
            replica_factory=self.fleet,
            scale_down_after=self.settings.scale_down_after,
        )
        self.metrics = Metrics(lambda: self.front.board(), lambda: len(self.bus), self.deployments.deployments)
        self.jobs = JobService(
            self.settings, self.store, self.bus, self.scheduler, self.deployments, self.payloads,
            self.results, observers=[self.metrics.jobs],
        )
        self.front = JobFront(
            self.store, self.bus, self.payloads, self.catalog,
            link=InProcessLink(self.jobs, lambda: board(self.jobs)), observers=[self.metrics.jobs],
        )

    async def settle(self) -> None:
        """Let the callbacks hopped onto the loop, and the stops sent to threads, run."""
        for _ in range(5):
            await asyncio.sleep(0.005)
        await self.jobs.settled()  # results being stored in a remote store

    async def start(self) -> "World":
        self.deployments.start()
        await self.settle()
        return self

    async def submit(self, principal, name: str, session: str = "") -> str:
        key = next(spec for spec in self.catalog if spec.name == name).model_key()
        job = await self.front.submit(principal, Submission(key, session, False, {}), b"payload", "http://x")
        await self.settle()
        return job.id

    def status(self, job_id: str) -> Status:
        return self.store.get(job_id).status

    def replica(self, name: str):
        return self.fleet.latest(name)


def updates(session) -> list[JobUpdate]:
    """What the job service published to a session, so far."""
    out = []
    while not session.queue.empty():
        out.append(JobUpdate.decode(session.queue.get_nowait()))
    return out


def spec(name: str, size: int = 10 * MiB, **extra) -> ModelSpec:
    return ModelSpec(repo_id=name, size_bytes=size, **extra)


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_job_goes_through_every_status_to_its_session(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        replica = world.replica("org/a")
        assert replica.health().state is ReplicaStatus.RUNNING
        session = await world.bus.open(ADA.user_id)
        job_id = await world.submit(ADA, "org/a", session.id)
        assert world.status(job_id) is Status.DISPATCHED and replica.ran == [job_id]
        replica.run()
        replica.log("hello from the job")
        replica.complete(b"x" * 100)
        await world.settle()
        job = world.store.get(job_id)
        assert job.status is Status.COMPLETED and job.result_size == 100
        assert world.store.logs(job_id) == ["hello from the job"]
        frames = updates(session)
        told = [update.status for update in frames]
        assert told == ["QUEUED", "DISPATCHED", "RUNNING", "LOG", "COMPLETED"]
        assert frames[-1].inline == b"x" * 100  # the small result rides inline
        counted = world.metrics.jobs.finished.labels("org/a", "COMPLETED")._value.get()
        assert counted == 1

    run(body())


def test_the_fair_queue_serves_the_user_who_waited_less(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        replica = world.replica("org/a")
        ada = [await world.submit(ADA, "org/a") for _ in range(3)]
        bob = await world.submit(BOB, "org/a")
        order = []
        for _ in range(4):
            order.append(replica.current.job_id)
            replica.run()
            replica.complete()
            await world.settle()
        # Ada's first was running when Bob came; Bob's one job goes before her other two.
        assert order == [ada[0], bob, ada[1], ada[2]]
        assert all(world.status(job_id) is Status.COMPLETED for job_id in order)

    run(body())


def test_the_fair_queue_charges_the_time_the_server_measured_not_the_reported_one(tmp_path):
    """A job that says it took 10 ms while holding the replica 10 s is charged 10 s."""
    async def body():
        now = [0.0]
        world = await World(tmp_path, [spec("org/a")], clock=lambda: now[0]).start()
        replica = world.replica("org/a")
        ada = [await world.submit(ADA, "org/a") for _ in range(3)]
        bob = [await world.submit(BOB, "org/a") for _ in range(2)]
        order = []
        for _ in range(5):
            order.append(replica.current.job_id)
            replica.run()
            now[0] += 10.0  # every job holds the replica 10 s; each reports 0.01 s
            replica.complete()
            await world.settle()
        # Believing the reports, Ada's jobs (charged 0.01 s each) would all run
        # before Bob's second one.
        assert order == [ada[0], bob[0], ada[1], bob[1], ada[2]]

    run(body())


def test_hotswap_demotes_an_idle_model_and_never_one_with_work(tmp_path):
    async def body():
        world = await World(
            tmp_path, [spec("org/a", 60 * MiB), spec("org/b", 60 * MiB, deploy="cold")],
            budgets={"cpu": 100 * MiB}, memory_margin=0,
        ).start()
        a = world.replica("org/a")
        busy = await world.submit(ADA, "org/a")
        waiting = await world.submit(BOB, "org/b")
        # org/a has a job running: it stays, and org/b's job waits, saying why.
        assert world.deployments.get("org/a").level is Level.HOT
        assert world.status(waiting) is Status.PROVISIONING
        assert "waiting for memory on cpu" in world.store.get(waiting).description
        a.run()
        a.complete()
        await world.settle()
        # Idle now: demoted for org/b, whose job runs.
        assert world.deployments.get("org/a").level is Level.COLD and a.stopped
        b = world.replica("org/b")
        assert world.deployments.get("org/b").level is Level.HOT
        assert b.ran == [waiting] and world.status(waiting) is Status.DISPATCHED
        assert "Demoted to make room for org/b" in world.deployments.get("org/a").note

    run(body())


def test_events_a_replica_may_not_send_are_dropped(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a"), spec("org/b")]).start()
        a, b = world.replica("org/a"), world.replica("org/b")
        mine = await world.submit(ADA, "org/a")
        queued_elsewhere = await world.submit(BOB, "org/b")
        b.run()
        await world.settle()
        # A replica of org/b claims org/a's job; org/a's replica forges a state the
        # lifecycle forbids, an unknown status and garbage.
        b.send(JobEvent(mine, "COMPLETED", "forged", result_size=1))
        a.send(JobEvent(mine, "QUEUED", "back to the queue, please"))
        a.send(JobEvent(mine, "DONE", "?"))
        a.send(JobEvent("../../etc", "ERROR", "path"))
        a.send(object())
        await world.settle()
        assert world.status(mine) is Status.DISPATCHED
        assert world.status(queued_elsewhere) is Status.RUNNING
        a.run()
        a.complete()
        await world.settle()
        assert world.status(mine) is Status.COMPLETED

    run(body())


def test_a_worker_that_dies_mid_job_fails_it_and_serves_the_next(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        replica = world.replica("org/a")
        first = await world.submit(ADA, "org/a")
        second = await world.submit(BOB, "org/a")
        replica.run()
        replica.die()
        await world.settle()
        assert world.status(first) is Status.ERROR
        assert "worker process stopped" in world.store.get(first).description
        assert replica.current.job_id == second
        replica.run()
        replica.complete()
        await world.settle()
        assert world.status(second) is Status.COMPLETED
        assert world.deployments.get("org/a").tally.counts()[Incident.WORKER_RESTART] == 1

    run(body())


def test_cancel_a_queued_and_a_running_job(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        replica = world.replica("org/a")
        running = await world.submit(ADA, "org/a")
        queued = await world.submit(ADA, "org/a")
        replica.run()
        await world.settle()
        assert world.jobs.cancel(world.store.get(queued))
        await world.settle()  # the row is written off the loop
        assert world.status(queued) is Status.ERROR
        assert "cancelled while it was queued" in world.store.get(queued).description
        assert world.jobs.cancel(world.store.get(running))
        await world.settle()
        assert replica.cancelled == [running] and world.status(running) is Status.ERROR
        assert not world.jobs.cancel(world.store.get(running))  # already ended
        assert replica.ran == [running]  # the cancelled queued job never reached the replica

    run(body())


def test_a_silent_job_past_its_limit_is_failed_and_stopped(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")], time_limit=5, kill_grace=1).start()
        replica = world.replica("org/a")
        job_id = await world.submit(ADA, "org/a")
        replica.run()
        await world.settle()
        assert world.jobs.sweep_stuck(now=time.time() + 1) == 0
        assert world.jobs.sweep_stuck(now=time.time() + 60) == 1
        await world.settle()
        assert world.status(job_id) is Status.ERROR
        assert "without finishing" in world.store.get(job_id).description
        assert replica.cancelled == [job_id]

    run(body())


def test_after_a_restart_what_may_have_run_fails_and_the_rest_runs(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        replica = world.replica("org/a")
        started = await world.submit(ADA, "org/a")
        replica.run()
        waiting = await world.submit(BOB, "org/a")
        assert world.status(waiting) is Status.QUEUED
        world.connection.close()

        again = World(tmp_path, [spec("org/a")])
        await again.jobs.recover()
        await again.start()
        assert again.status(started) is Status.ERROR
        assert "restarted while your request was running" in again.store.get(started).description
        assert again.replica("org/a").ran == [waiting]
        assert again.status(waiting) is Status.DISPATCHED

    run(body())


@pytest.mark.parametrize("level", [Level.HOT, Level.WARM])
def test_levels_are_enums_that_read_as_their_names(level):
    assert level == level.value and f"{level}" == level.value and json.dumps(level) == f'"{level.value}"'


def test_a_model_grows_while_jobs_wait_and_shrinks_back_when_idle(tmp_path):
    async def body():
        world = await World(
            tmp_path, [spec("org/a", 40 * MiB, replicas=1, max_replicas=3)],
            budgets={"cpu": 100 * MiB}, memory_margin=0, scale_down_after=60, scale_up_after=0,
        ).start()
        deployment = world.deployments.get("org/a")
        jobs = [await world.submit(ADA, "org/a") for _ in range(4)]
        # One waits: a second replica is started; a third would not fit 100 MiB.
        assert [r.name for r in deployment.replicas] == ["org/a#1", "org/a#2"]
        running = [r.current.job_id for r in deployment.replicas]
        assert running == jobs[:2]
        assert world.status(jobs[2]) is Status.QUEUED
        assert world.deployments.used("cpu") == 80 * MiB
        for replica in list(deployment.replicas):
            replica.run()
            replica.complete()
        await world.settle()
        for replica in deployment.replicas:
            if replica.current is not None:
                replica.run()
                replica.complete()
        await world.settle()
        assert all(world.status(job_id) is Status.COMPLETED for job_id in jobs)
        # Idle: nothing is stopped before its time, then the extra one goes, never the minimum.
        assert world.deployments.shrink(time.monotonic() + 10) == []
        assert world.deployments.shrink(time.monotonic() + 61) == ["org/a#2"]
        await world.settle()
        assert [r.name for r in deployment.replicas] == ["org/a#1"]
        assert world.fleet.latest("org/a#2").stopped
        assert world.deployments.shrink(time.monotonic() + 1000) == []
        assert world.deployments.used("cpu") == 40 * MiB

    run(body())


def test_max_replicas_below_replicas_is_refused():
    with pytest.raises(ValueError, match="max_replicas must be at least replicas"):
        ModelEntry(repo_id="org/a", replicas=2, max_replicas=1)


def test_a_replica_is_asked_for_what_it_holds_on_each_device():
    from nnhost.replicas.ray_replica import resources_for

    big = ModelSpec(repo_id="org/70b", device_map={f"layer{i}": f"cuda:{i}" for i in range(8)},
                    size_bytes=8 * 20 * MiB)
    big.shares = {f"cuda:{i}": 20 * MiB for i in range(8)}
    assert resources_for(big.hot_shares()) == {"num_cpus": 1, "num_gpus": 8}
    assert resources_for({"cpu": 40 * MiB}) == {"num_cpus": 1, "memory": 40 * MiB}


def test_a_model_grows_only_once_its_oldest_job_has_waited_long_enough(tmp_path):
    async def body():
        world = await World(
            tmp_path, [spec("org/a", 10 * MiB, replicas=1, max_replicas=2)], scale_up_after=30,
        ).start()
        deployment = world.deployments.get("org/a")
        first, second = await world.submit(ADA, "org/a"), await world.submit(BOB, "org/a")
        assert world.status(second) is Status.QUEUED
        world.jobs.pump_waiting(now=time.monotonic() + 29)
        assert len(deployment.replicas) == 1  # not yet: a short wait is cheaper than a load
        world.jobs.pump_waiting(now=time.monotonic() + 31)
        assert [r.name for r in deployment.replicas] == ["org/a#1", "org/a#2"]
        world.fleet.latest("org/a#2").ready()
        await world.settle()
        assert world.status(second) is Status.DISPATCHED and world.status(first) is Status.DISPATCHED

    run(body())


def test_a_payload_deletion_that_hangs_holds_a_thread_not_the_loop(tmp_path):
    """The payload store blocks (a file, or a database row with split roles): a job's end deletes it off the loop."""
    import threading

    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        job_id = await world.submit(ADA, "org/a")
        entered, release = threading.Event(), threading.Event()
        delete = world.payloads.delete

        def stuck_delete(job: str) -> None:
            entered.set()
            assert release.wait(60), "the deletion was never let go"
            delete(job)

        world.payloads.delete = stuck_delete
        replica = world.replica("org/a")
        replica.run()
        replica.complete(b"x" * 10)
        # The loop goes on while the deletion waits in its thread.
        for _ in range(200):
            await asyncio.sleep(0.005)
            if entered.is_set():
                break
        assert entered.is_set()
        await asyncio.sleep(0.01)
        assert world.status(job_id) is Status.COMPLETED
        assert world.payloads.exists(job_id)
        release.set()
        await world.settle()
        assert not world.payloads.exists(job_id)

    run(body())


def test_a_model_that_never_serves_fails_its_waiting_jobs_after_a_few_starts(tmp_path):
    """Replicas that keep turning unhealthy are started again, a bounded number of times, then the jobs end."""
    from nnhost.controller.service import START_ATTEMPTS

    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        first = await world.submit(ADA, "org/a")
        world.replica("org/a").run()
        world.replica("org/a").complete()
        await world.settle()
        assert world.status(first) is Status.COMPLETED
        world.fleet.broken = "Job processes keep dying before their first job; see the server log."
        world.replica("org/a")._set(ReplicaStatus.UNHEALTHY, world.fleet.broken)
        waiting = await world.submit(ADA, "org/a")
        for _ in range(20):
            await world.settle()
        job = world.store.get(waiting)
        assert job.status is Status.ERROR, job
        assert "org/a could not be started (3 attempts): Job processes keep dying" in job.description
        assert len([r for r in world.fleet.made if r.name == "org/a"]) == 1 + START_ATTEMPTS
        # A later request tries again, and is served once the model is mended.
        world.fleet.broken = None
        again = await world.submit(ADA, "org/a")
        await world.settle()
        world.replica("org/a").run()
        world.replica("org/a").complete()
        await world.settle()
        assert world.status(again) is Status.COMPLETED

    run(body())


def test_a_graceful_stop_records_a_final_report_still_on_its_way_instead_of_requeueing(tmp_path):
    """A replica frees itself just before its job's final report reaches the loop: that job finished."""
    from pathlib import Path

    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        job_id = await world.submit(ADA, "org/a")
        replica = world.replica("org/a")
        replica.run()
        await world.settle()
        running, replica.current = replica.current, None  # free, its report not yet sent
        draining = asyncio.create_task(world.jobs.drain(10.0))
        await asyncio.sleep(0.3)
        Path(running.result_path).write_bytes(b"x" * 10)
        replica.send(JobEvent(job_id, "COMPLETED", "Your job has been completed.", meta={"runtime": 0.01},
                              result_size=10))
        await draining
        await world.settle()
        assert world.status(job_id) is Status.COMPLETED

    run(body())

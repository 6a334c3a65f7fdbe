"""The controller's loop never waits on a job row's write; what it announces was stored, in order.

The controller changes its view of a job at once and writes the row in a
worker thread, one write after another (`controller.recorder`). Shown without a
clock, as tests/test_loop_stays_free.py shows it for the API process: the
store's `transition` blocks on an event that the test sets only after the
loop has done other work meanwhile (another job's events, a dispatch, a
graceful stop's first steps). Were the write made on the loop, that work could
not come first: the blocked write gives up after a while, and the test sees
that it was not the one that let it go. Once let go: the rows, the updates on
the bus and what the observers saw, each in the order the controller decided.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from test_controller_loop import Composed
from test_service_inprocess import ADA, World, spec, updates

from nnhost.controller import recorder
from nnhost.front.jobs import Submission
from nnhost.jobs.job import Status
from nnhost.jobs.store import Transition
from nnhost.storage.blocking import run_blocking

#: Only a guard against a hang: nothing here is timed.
GIVE_UP = 60.0


class StuckTransition:
    """The store's `transition` and `apply`, blocking the first write of one job's status until let go.

    The recorder writes one change with `transition`, several in one
    transaction with `apply`: whichever carries it blocks.
    """

    def __init__(self, store, job_id: str, status: Status) -> None:
        self._transition, self._apply = store.transition, store.apply
        store.transition, store.apply = self.transition, self.apply
        self.job_id, self.status = job_id, status
        self.entered = threading.Event()
        self.release = threading.Event()
        #: None while blocked (or before); then whether the test let it go (rather than waited out).
        self.let_go = None
        self._armed = True

    def _block_on(self, job_id, status) -> None:
        if self._armed and (job_id, status) == (self.job_id, self.status):
            self._armed = False
            self.entered.set()
            self.let_go = self.release.wait(GIVE_UP)

    def transition(self, job_id, status, description, **fields):
        self._block_on(job_id, status)
        return self._transition(job_id, status, description, **fields)

    def apply(self, writes):
        for write in writes:
            if isinstance(write, Transition):
                self._block_on(write.job_id, write.status)
        return self._apply(writes)


class Noted:
    """A job observer (as metrics are) that writes down what it is told."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def job_changed(self, job) -> None:
        self.seen.append((job.id, job.status.value))


async def until(condition) -> None:
    """Let the loop run until ``condition()`` holds (a guard, not a timer)."""
    for _ in range(int(GIVE_UP / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the loop never got there")


def told(session) -> list[tuple[str, str]]:
    return [(update.job_id, update.status) for update in updates(session)]


def test_a_write_stuck_in_the_store_leaves_the_loop_taking_reports_and_dispatching(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a"), spec("org/b")]).start()
        noted = Noted()
        world.jobs.recorder.observers.add(noted)
        session = await world.bus.open(ADA.user_id)
        a = await world.submit(ADA, "org/a", session.id)
        b = await world.submit(ADA, "org/b", session.id)
        assert told(session) == [(a, "QUEUED"), (a, "DISPATCHED"), (b, "QUEUED"), (b, "DISPATCHED")]
        noted.seen.clear()
        stuck = StuckTransition(world.store, a, Status.RUNNING)
        replica_a, replica_b = world.replica("org/a"), world.replica("org/b")
        replica_a.run()
        replica_a.log("one")
        replica_a.complete(b"a" * 10)
        # Waited for off the loop, so the loop takes A's reports up to the stuck write meanwhile.
        assert await run_blocking(stuck.entered.wait, GIVE_UP)

        # While A's RUNNING holds a worker thread, the loop takes B's reports, and
        # dispatches a new job to the replica B's COMPLETED freed.
        replica_b.run()
        replica_b.complete(b"b" * 10)
        key = spec("org/b").model_key()
        c = (await world.front.submit(ADA, Submission(key, session.id, False, {}), b"payload", "http://x")).id
        await until(lambda: replica_b.ran == [b, c])
        assert stuck.let_go is None  # still blocked: the loop did all that without it
        # Nothing is announced, to the client or the observers, before its row is written,
        # and the rows wait their turn behind A's.
        assert told(session) == [] and noted.seen == []
        rows = {job_id: (await run_blocking(world.store.get, job_id)).status for job_id in (a, b, c)}
        assert rows == {a: Status.DISPATCHED, b: Status.DISPATCHED, c: Status.RECEIVED}

        stuck.release.set()
        await world.settle()
        assert stuck.let_go is True, "the stuck write was not let go by the test: it blocked the loop"
        # Stored, then announced, each job in its order and the jobs in the order they changed.
        stored = world.store.get(a)
        assert stored.status is Status.COMPLETED and stored.result_size == 10
        assert world.store.logs(a) == ["one"]
        assert world.status(b) is Status.COMPLETED and world.status(c) is Status.DISPATCHED
        assert told(session) == [
            (a, "RUNNING"), (a, "LOG"), (a, "COMPLETED"),
            (b, "RUNNING"), (b, "COMPLETED"),
            (c, "QUEUED"), (c, "DISPATCHED"),
        ]
        assert noted.seen == [
            (a, "RUNNING"), (a, "COMPLETED"), (b, "RUNNING"), (b, "COMPLETED"),
            (c, "QUEUED"), (c, "DISPATCHED"),
        ]

    asyncio.run(body())


def test_a_write_that_fails_is_logged_and_never_announced(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(recorder, "RETRY_AFTER", 0.0)

    async def body():
        world = await World(tmp_path, [spec("org/a"), spec("org/b")]).start()
        noted = Noted()
        world.jobs.recorder.observers.add(noted)
        session = await world.bus.open(ADA.user_id)
        a = await world.submit(ADA, "org/a", session.id)
        updates(session)
        transition = world.store.transition
        tries = []

        def failing(job_id, status, description, **fields):
            if (job_id, status) == (a, Status.RUNNING):
                tries.append(status)
                raise ConnectionError("the database went away")
            return transition(job_id, status, description, **fields)

        world.store.transition = failing
        with caplog.at_level(logging.WARNING, logger="nnhost.jobs"):
            world.replica("org/a").run()
            await world.settle()
        assert tries == [Status.RUNNING] * recorder.ATTEMPTS  # it may pass: tried again
        assert f"could not store RUNNING of job {a}; it is not announced" in caplog.text
        assert "the database went away" in caplog.text
        assert world.status(a) is Status.DISPATCHED
        assert told(session) == [] and (a, "RUNNING") not in noted.seen
        # The writer goes on: another job's changes are stored and announced.
        b = await world.submit(ADA, "org/b", session.id)
        assert world.status(b) is Status.DISPATCHED
        assert told(session) == [(b, "QUEUED"), (b, "DISPATCHED")]

    asyncio.run(body())


def test_a_graceful_stop_returns_only_once_its_writes_are_stored(tmp_path):
    async def body():
        world = Composed(tmp_path, [spec("org/a")])
        world.controller.deployments.start()
        await world.settle()
        job_id = await world.submit("org/a")
        assert world.store.get(job_id).status is Status.DISPATCHED
        stuck = StuckTransition(world.store, job_id, Status.QUEUED)
        stopping = asyncio.create_task(world.controller.stop(0.0))
        assert await run_blocking(stuck.entered.wait, GIVE_UP)
        for _ in range(20):  # the loop turns; the stop waits for the write
            await asyncio.sleep(0.005)
        assert not stopping.done() and stuck.let_go is None
        stuck.release.set()
        await stopping
        assert stuck.let_go is True, "the stuck write was not let go by the test: it blocked the loop"
        # Requeued and stored before the stop returned: the next controller runs it again.
        assert world.store.get(job_id).status is Status.QUEUED

    asyncio.run(body())


#: Every method of the job store (`jobs.store.JobStore`) the controller or the front may call.
STORE_METHODS = ("get", "with_status", "for_user", "unfinished_count", "search", "expired_results",
                 "logs", "create", "transition", "apply", "forget_result", "delete_logs",
                 "delete_logs_before", "add_log")


class Watched:
    """A job store's methods, each noting whether it was called on the event loop's thread."""

    def __init__(self, store, loop_thread: int) -> None:
        self.called: set[str] = set()
        self.on_loop: list[str] = []
        for name in STORE_METHODS:
            setattr(store, name, self._watch(name, getattr(store, name), loop_thread))

    def _watch(self, name, method, loop_thread):
        def watched(*args, **kwargs):
            self.called.add(name)
            if threading.get_ident() == loop_thread:
                self.on_loop.append(name)
            return method(*args, **kwargs)

        return watched


def test_no_job_store_call_of_the_controller_runs_on_its_loop(tmp_path):
    """Recovery, dispatch, replica events, LOG lines, a result, a cancel, both sweeps and a
    graceful stop, with every store call watched: none is made on the loop's thread."""

    async def body():
        world = World(tmp_path, [spec("org/a")], time_limit=5, kill_grace=1)
        watched = Watched(world.store, threading.get_ident())
        await world.jobs.recover()
        await world.start()
        session = await world.bus.open(ADA.user_id)
        replica = world.replica("org/a")
        done = await world.submit(ADA, "org/a", session.id)
        cancelled = await world.submit(ADA, "org/a", session.id)  # waits behind it
        replica.run()
        replica.log("a line")
        replica.complete(b"r" * 10)
        await world.settle()
        assert world.jobs.cancel(await run_blocking(world.store.get, cancelled))
        stuck = await world.submit(ADA, "org/a", session.id)
        replica.run()
        await world.settle()
        assert world.jobs.sweep_stuck(now=time.time() + 3600) == 1
        await world.jobs.sweep_results(now=time.time() + 10 * world.settings.result_retention)
        requeued = await world.submit(ADA, "org/a", session.id)
        await world.jobs.drain(0.0)
        await world.settle()
        jobs = {"done": done, "cancelled": cancelled, "stuck": stuck, "requeued": requeued}
        statuses = {name: (await run_blocking(world.store.get, job_id)).status
                    for name, job_id in jobs.items()}
        return watched, statuses

    watched, statuses = asyncio.run(body())
    assert watched.on_loop == [], f"job store calls made on the controller's loop: {watched.on_loop}"
    # Not vacuous: the scenario made the controller's reads and writes of every kind.
    # (A batch of writes goes to the store in one `apply`; a lone one as a `transition`.)
    assert {"with_status", "transition", "apply", "expired_results", "delete_logs_before"} <= watched.called
    assert statuses == {
        "done": Status.COMPLETED, "cancelled": Status.ERROR, "stuck": Status.ERROR,
        "requeued": Status.QUEUED,
    }


class StuckDispatch(StuckTransition):
    """Blocks the first DISPATCHED write, whichever job's (its id is not known before its POST)."""

    def __init__(self, store) -> None:
        super().__init__(store, "", Status.DISPATCHED)

    def _block_on(self, job_id, status) -> None:
        if status is Status.DISPATCHED:
            super()._block_on(self.job_id, status)


def test_a_jobs_later_statuses_are_not_logged_as_the_request_that_queued_it(tmp_path):
    """A job's QUEUED and DISPATCHED are decided inside its POST, and logged with its id; what
    the replica reports later is not, even while the writer that the POST set going still runs.

    The writer is a task, and a task keeps the context it was made in: made while a POST
    queued its job, it logged every change it wrote after, of any job, as that POST's.
    """
    from nnhost.telemetry import logs

    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        heard: list[tuple[str, object]] = []

        class Heard:
            def job_changed(self, job) -> None:
                heard.append((job.status.value, logs.request_id.get()))

        world.jobs.recorder.observers.add(Heard())
        session = await world.bus.open(ADA.user_id)
        stuck = StuckDispatch(world.store)
        token = logs.request_id.set("the-post")  # as the API's middleware does for each request
        try:
            key = spec("org/a").model_key()
            job = await world.front.submit(ADA, Submission(key, session.id, False, {}), b"payload", "http://x")
        finally:
            logs.request_id.reset(token)
        assert await run_blocking(stuck.entered.wait, GIVE_UP)
        replica = world.replica("org/a")
        await until(lambda: replica.ran == [job.id])
        replica.run()
        replica.complete(b"r" * 10)
        # Decided (the controller's view) while the DISPATCHED write still holds the writer.
        await until(lambda: world.jobs.recorder.job(job.id).status is Status.COMPLETED)
        assert stuck.let_go is None
        stuck.release.set()
        await world.settle()
        await world.jobs.recorder.flush()
        assert heard == [
            ("QUEUED", "the-post"), ("DISPATCHED", "the-post"), ("RUNNING", None), ("COMPLETED", None),
        ]

    asyncio.run(body())

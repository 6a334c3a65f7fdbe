"""A job's process warms up only when no job waits for it, and never beside a running job.

A warm-up (`job.process.live`) runs a request of the server's own: pages
copied, torch's threads started, so the job finds them done. It costs a
whole request's CPU, and a waiting job waits for it too, so under load it is
a loss: py-spy put it at about a fifth of a busy server's CPU. When the job
service dispatches a job with more waiting for the same model, the replica
asks for the next job process without one. With none waiting, the next
process is told to warm up (`messages.Warm`) once the running job has ended:
warming up beside it, on a two-core machine, made the job itself take 17-23
ms instead of 5 (the first run in its process, measured there).
"""

from __future__ import annotations

import socket
import threading

from fakes import BareReplicaSide

from nnhost.execution.channel import Channel
from nnhost.execution.events import JobSpec
from nnhost.execution.messages import TO_SPARE, Event, Fork, Ready, Warm
from nnhost.execution.policy import WorkerPolicy
from nnhost.replicas.contract import ReplicaState, ReplicaStatus
from nnhost.replicas.process_slot import Slot
from nnhost.replicas.slots import JobProcesses


def _one_job(tmp_path, more_waiting: bool) -> tuple[Fork, list[object], list[object]]:
    """A replica runs one job (``more_waiting`` behind it or not) while its next process gets ready.

    Returns the Fork asked for when the job took the ready process, what the
    next process was told while the job ran, and what it was told once the
    job's final event was read.
    """
    replica = BareReplicaSide()
    jobs = JobProcesses("org/a", WorkerPolicy(), threading.RLock(), replica,
                        on_job_event=lambda event: None, on_idle=lambda: None, on_incident=lambda kind: None)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    running = Slot(pid=12345, channel=Channel(ours), ready=True)
    jobs.spare = running
    (tmp_path / "payload").write_bytes(b"x")
    spec = JobSpec("0" * 32, str(tmp_path / "payload"), False, result_path=str(tmp_path / "result"))
    jobs.submit(spec, more_waiting)
    (fork,) = [message for message in replica.sent if isinstance(message, Fork)]
    # The next process says it is ready while the job runs.
    next_ours, next_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    following = Slot(pid=12346, channel=Channel(next_ours))
    jobs.slots[following.pid] = following
    assert jobs._slot_message(following, Ready(), [])
    told = Channel(next_theirs)

    def heard() -> list[object]:
        next_theirs.setblocking(False)
        messages = []
        try:
            while True:
                message, _ = TO_SPARE.receive(told)
                messages.append(message)
        except BlockingIOError:
            return messages

    while_running = heard()
    assert jobs._slot_message(running, Event(job_id=spec.job_id, status="RUNNING", description="r"), [])
    (tmp_path / "result").write_bytes(b"r")  # what the job wrote
    jobs._slot_message(running, Event(job_id=spec.job_id, status="COMPLETED", description="c", result_size=1), [])
    after = heard()
    for sock in (ours, theirs, next_ours, next_theirs):
        sock.close()
    return fork, while_running, after


def test_with_jobs_waiting_the_next_job_process_never_warms_up(tmp_path):
    fork, while_running, after = _one_job(tmp_path, more_waiting=True)
    assert fork.warm is False and while_running == [] and after == []


def test_with_no_job_waiting_the_next_job_process_warms_up_once_the_job_is_done(tmp_path):
    """Not beside the running job: its warm-up took the CPU the job needed."""
    fork, while_running, after = _one_job(tmp_path, more_waiting=False)
    assert fork.warm is False
    assert while_running == []
    assert [type(message) for message in after] == [Warm]


def test_the_job_service_says_when_more_jobs_wait(tmp_path):
    """Dispatching the first of two queued jobs says more wait; the second, that none do."""
    import asyncio

    from test_service_inprocess import ADA, World, spec

    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        replica = world.replica("org/a")
        told = []
        submit = replica.submit
        replica.submit = lambda job, more_waiting=False: (told.append(more_waiting), submit(job))
        replica.state = ReplicaState(ReplicaStatus.DEPLOYING, "Loading.")  # two jobs queue up meanwhile
        await world.submit(ADA, "org/a")
        await world.submit(ADA, "org/a")
        replica.ready()
        await world.settle()
        replica.run()
        replica.complete()
        await world.settle()
        assert told == [True, False]

    asyncio.run(body())


class _Host:
    """A host process's stand-in: the replica sees it alive until it is told to stop."""

    pid = 0
    returncode = None

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        self.returncode = 0
        return 0

    def kill(self) -> None:
        self.returncode = -9


def _first_fork(monkeypatch, jobs_waiting: bool) -> Fork:
    """The first Fork a replica asks of its host, once the host says RUNNING."""
    from nnhost.execution.channel import pair
    from nnhost.execution.messages import TO_HOST, Options, State
    from nnhost.execution.policy import WorkerOptions
    from nnhost.replicas import replica as replica_module

    ours, theirs = pair()
    host_side = Channel(theirs)

    class Spares:
        def take(self, env, environ):
            return _Host(), Channel(ours)

        def keep(self, env, environ, count) -> None:
            pass

    monkeypatch.setattr(replica_module, "SPARES", Spares())
    replica = replica_module.LocalReplica(
        "org/a", WorkerOptions(model_key="org/a"), on_job_event=lambda event: None,
        on_state=lambda state: None, on_idle=lambda: None,
    )
    replica.start(jobs_waiting=jobs_waiting)
    try:
        message, _ = TO_HOST.receive(host_side)
        assert isinstance(message, Options)
        host_side.send(State(state="RUNNING", description="Loaded."))
        message, _ = TO_HOST.receive(host_side)
        assert isinstance(message, Fork), message
        return message
    finally:
        replica.stop()
        host_side.close()


def test_a_cold_start_for_waiting_jobs_forks_its_first_job_process_without_a_warm_up(monkeypatch):
    assert _first_fork(monkeypatch, jobs_waiting=True).warm is False


def test_a_start_with_no_job_waiting_warms_up_its_first_job_process(monkeypatch):
    assert _first_fork(monkeypatch, jobs_waiting=False).warm is True


def test_the_manager_says_when_jobs_wait_for_a_start(tmp_path):
    """A COLD model started for a queued job is told so; one the catalog starts is not."""
    import asyncio

    from test_service_inprocess import ADA, World, spec

    async def body():
        world = await World(tmp_path, [spec("org/a"), spec("org/b", deploy="cold")]).start()
        assert world.replica("org/a").started_with_jobs_waiting == [False]
        await world.submit(ADA, "org/b")
        await world.settle()
        assert world.replica("org/b").started_with_jobs_waiting == [True]

    asyncio.run(body())

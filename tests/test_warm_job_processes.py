"""A job's process warms up before it is ready only when no job waits for it.

A warm-up (`job_process.live`) runs a request of the server's own: pages
copied, torch's threads started, so the job finds them done. It costs a
whole request's CPU, and a waiting job waits for it too, so under load it is
a loss: py-spy put it at about a fifth of a busy server's CPU. When the job
service dispatches a job with more waiting for the same model, the replica
asks for the next job process without one.
"""

from __future__ import annotations

import socket
import threading

from nnhost.execution.channel import Channel
from nnhost.execution.events import JobSpec
from nnhost.execution.messages import Fork
from nnhost.execution.policy import WorkerPolicy
from nnhost.replicas.contract import ReplicaState, ReplicaStatus
from nnhost.replicas.slots import JobProcesses, Slot


class Replica:
    """The replica side, as far as asking for job processes goes."""

    stopping = False
    generation = 1
    groups = None
    host_kill_reason = None

    def __init__(self) -> None:
        self.sent: list[object] = []

    def send_control(self, message) -> None:
        self.sent.append(message)

    def kill_host(self, reason) -> None:
        raise AssertionError("no host to kill here")

    def unhealthy(self, description: str) -> None:
        raise AssertionError(description)

    def show_containment(self, slot) -> None:
        pass


def _fork_after(tmp_path, more_waiting: bool) -> Fork:
    """The Fork asked for when a job takes the ready process (with ``more_waiting`` behind it or not)."""
    replica = Replica()
    jobs = JobProcesses("org/a", WorkerPolicy(), threading.RLock(), replica,
                        on_job_event=lambda event: None, on_idle=lambda: None, on_incident=lambda kind: None)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    slot = Slot(pid=12345, channel=Channel(ours), ready=True)
    jobs.spare = slot
    (tmp_path / "payload").write_bytes(b"x")
    jobs.submit(JobSpec("0" * 32, str(tmp_path / "payload"), False, result_path=str(tmp_path / "result")),
                more_waiting)
    ours.close()
    theirs.close()
    (fork,) = [message for message in replica.sent if isinstance(message, Fork)]
    return fork


def test_with_jobs_waiting_the_next_job_process_goes_without_a_warm_up(tmp_path):
    assert _fork_after(tmp_path, more_waiting=True).warm is False


def test_with_no_job_waiting_the_next_job_process_warms_up(tmp_path):
    assert _fork_after(tmp_path, more_waiting=False).warm is True


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
    from nnhost.execution.worker import WorkerOptions
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

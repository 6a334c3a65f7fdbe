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

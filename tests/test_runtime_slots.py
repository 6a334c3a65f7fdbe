"""How a replica's job processes serve a job of another nnsight runtime (`replicas.slots`).

No process here: the replica side is `fakes.BareReplicaSide`, which keeps what
would go to the host and to each runtime's template, and a job process is
the replica's end of a socket pair. What is shown: a job of a runtime with
no ready process waits, counted against the capacity, while that runtime is
asked for one; the runtime's process, once ready, takes it, and the next is
asked for; a process of one runtime never takes another runtime's job, nor
a parked one another runtime's; a runtime that cannot start fails the jobs
that wait for it, with its reason (and `replicas.runtimes` says why, for one
that is not installed); a waiting job can be cancelled; a runtime idle past
``runtime_idle`` is retired, and one with work is not; a runtime's next
process warms up only once no job runs; only a fork starts a runtime's
template again.
"""

from __future__ import annotations

import socket
import threading

import pytest
from fakes import BareReplicaSide, FakeJobProcess

from nnhost.execution.channel import Channel
from nnhost.execution.events import JobSpec
from nnhost.execution.messages import Discard, Fork, Run
from nnhost.execution.policy import WorkerPolicy
from nnhost.replicas.process_slot import Slot
from nnhost.replicas.slots import JobProcesses


@pytest.fixture
def world(tmp_path):
    replica = BareReplicaSide()
    events: list = []
    jobs = JobProcesses("org/a", WorkerPolicy(runtime_idle=60.0), threading.RLock(), replica,
                        on_job_event=events.append, on_idle=lambda: None, on_incident=lambda kind: None)
    jobs.capacity = 2
    sockets: list[socket.socket] = []
    yield jobs, replica, events, sockets, tmp_path
    for sock in sockets:
        sock.close()


def job(tmp_path, n: int, runtime: str = "", owner: str = "") -> JobSpec:
    (tmp_path / f"payload-{n}").write_bytes(b"x")
    return JobSpec(f"{n:032d}", str(tmp_path / f"payload-{n}"), False, result_path=str(tmp_path / f"result-{n}"),
                   runtime=runtime, owner=owner)


def ready_process(jobs, sockets, pid: int, runtime: str = "") -> FakeJobProcess:
    """A job process of ``runtime`` that has just said it is ready (closed with the test's sockets)."""
    process = FakeJobProcess(jobs, pid, runtime)
    sockets += [process.slot.channel.sock, process.theirs]
    return process


def test_a_job_waits_for_its_runtimes_first_process_and_takes_it(world):
    jobs, replica, events, sockets, tmp_path = world
    spec = job(tmp_path, 1, runtime="0.8.0")
    jobs.submit(spec)
    assert [(runtime, type(message)) for runtime, message in replica.sent_to] == [("0.8.0", Fork)]
    assert not any(isinstance(message, Fork) for message in replica.sent), "the host was asked instead"
    assert jobs.running == [] and len(jobs.queued["0.8.0"]) == 1
    jobs.submit(job(tmp_path, 2, runtime="0.8.0"))
    assert not jobs.has_room, "a waiting job counts against the capacity"
    assert len(replica.sent_to) == 1, "one process is asked for at a time"

    first = ready_process(jobs, sockets, 501, runtime="0.8.0")
    assert [type(message) for message in first.told()] == [Run]
    assert first.slot.job is not None and first.slot.job.job_id == spec.job_id and jobs.running == [first.slot]
    assert [(runtime, type(message)) for runtime, message in replica.sent_to][1:] == [("0.8.0", Fork)]
    second = ready_process(jobs, sockets, 502, runtime="0.8.0")
    assert [type(message) for message in second.told()] == [Run]
    assert jobs.queued == {}


def test_a_process_of_one_runtime_never_takes_anothers_job(world):
    jobs, replica, events, sockets, tmp_path = world
    own = ready_process(jobs, sockets, 600)
    assert jobs.spare is own.slot
    jobs.submit(job(tmp_path, 1, runtime="0.8.0"))
    assert jobs.spare is own.slot and own.told() == []
    other = ready_process(jobs, sockets, 601, runtime="0.8.0")
    assert other.told() and other.slot.job is not None
    # And a ready process of the runtime stays that runtime's when the server's own version asks.
    spare = ready_process(jobs, sockets, 602, runtime="0.8.0")
    assert jobs.runtime_spares == {"0.8.0": spare.slot}
    jobs.submit(job(tmp_path, 2))
    assert own.slot.job is not None and spare.slot.job is None and spare.told() == []


def test_a_parked_process_takes_only_its_owners_job_of_its_runtime(world):
    jobs, replica, events, sockets, tmp_path = world
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sockets += [ours, theirs]
    parked = Slot(pid=700, channel=Channel(ours), runtime="0.8.0", ready=True)
    parked.owner = "ada"
    jobs.parking.parked.append(parked)
    assert jobs.parking.take("ada", "") is None
    assert jobs.parking.take("ada", "0.8.0") is parked


def test_a_runtime_that_cannot_start_fails_the_jobs_that_wait_for_it(world):
    jobs, replica, events, sockets, tmp_path = world
    jobs.submit(job(tmp_path, 1, runtime="0.8.0"))
    jobs.submit(job(tmp_path, 2, runtime="0.8.0"))
    jobs.runtime_failed("0.8.0", "The nnsight 0.8.0 runtime could not start: no runtime is installed for it.")
    assert [(event.status, event.description) for event in events] == [
        ("ERROR", "The nnsight 0.8.0 runtime could not start: no runtime is installed for it. "
                  "You can resubmit your request."),
    ] * 2
    assert jobs.queued == {} and jobs.has_room


def test_a_waiting_job_can_be_cancelled(world):
    jobs, replica, events, sockets, tmp_path = world
    spec = job(tmp_path, 1, runtime="0.8.0")
    jobs.submit(spec)
    assert jobs.cancel_queued(spec.job_id, "cancelled")
    assert not jobs.cancel_queued(spec.job_id, "cancelled")
    assert [(event.job_id, event.status) for event in events] == [(spec.job_id, "ERROR")]


def test_a_runtime_idle_for_long_is_retired_and_one_with_work_is_not(world):
    jobs, replica, events, sockets, tmp_path = world
    jobs.submit(job(tmp_path, 1, runtime="0.8.0"))
    used = jobs.runtime_used["0.8.0"]
    jobs.expire(used + 120)  # long idle, but its job still waits for a process
    assert replica.retired == []
    ready_process(jobs, sockets, 800, runtime="0.8.0")
    running = jobs.running[0]
    jobs.expire(used + 120)
    assert replica.retired == [], "its job runs"
    jobs.running.remove(running)
    spare = ready_process(jobs, sockets, 801, runtime="0.8.0").slot
    jobs.expire(used + 30)
    assert replica.retired == [], "not idle long enough"
    jobs.expire(used + 120)
    assert replica.retired == ["0.8.0"]
    assert ("0.8.0", Discard(pid=spare.pid)) in replica.sent_to and jobs.runtime_spares == {}


def test_a_runtimes_next_process_warms_up_once_no_job_runs(world):
    """As the server's own spare does (`test_warm_job_processes`): not beside a running job."""
    from nnhost.execution.messages import Event, Warm

    jobs, replica, events, sockets, tmp_path = world
    spec = job(tmp_path, 1, runtime="0.8.0")
    jobs.submit(spec)
    first = ready_process(jobs, sockets, 900, runtime="0.8.0").slot
    following = ready_process(jobs, sockets, 901, runtime="0.8.0")
    assert following.told() == [], "it warmed up beside the running job"
    assert jobs._slot_message(first, Event(job_id=spec.job_id, status="RUNNING", description="r"), [])
    (tmp_path / "result-1").write_bytes(b"r")
    jobs._slot_message(first, Event(job_id=spec.job_id, status="COMPLETED", description="c", result_size=1), [])
    assert [type(message) for message in following.told()] == [Warm]


def test_a_runtime_that_is_not_installed_says_so_to_the_jobs_waiting_for_it():
    """`replicas.runtimes`: a template that cannot start reports why, and nothing is left running."""
    from nnhost.execution.policy import WorkerOptions
    from nnhost.replicas.runtimes import RuntimeTemplates

    class Side:
        generation = 1

        def __init__(self) -> None:
            self.failed: list[tuple[str, str]] = []
            self.done = threading.Event()

        def send_control(self, message) -> None:
            raise AssertionError(f"the host was asked for {message} before any template ran")

        def runtime_slot(self, *args) -> None:
            raise AssertionError("no job process can come from a runtime that is not there")

        def runtime_exit(self, pid, status) -> None:
            pass

        def runtime_failed(self, runtime: str, description: str) -> None:
            self.failed.append((runtime, description))
            self.done.set()

    side = Side()
    policy = WorkerPolicy(runtimes={"0.8.0": "/nonexistent/nnhost-runtimes/nnsight-0.8.0/bin/python"})
    templates = RuntimeTemplates("org/a", policy, WorkerOptions(model_key="m"), side, ())
    templates.send("0.8.0", Fork(memory_cgroup=False, warm=False))
    assert side.done.wait(30)
    ((runtime, description),) = side.failed
    assert runtime == "0.8.0"
    assert "no runtime is installed for it" in description and "`nnhost runtimes 0.8.0`" in description
    assert templates.memory() == {}


def test_only_a_fork_starts_a_runtimes_template(monkeypatch):
    """A `Discard` or `Park` for a runtime that stopped names processes that ended with it."""
    from nnhost.execution.messages import Park
    from nnhost.execution.policy import WorkerOptions
    from nnhost.replicas import runtimes
    from nnhost.replicas.runtimes import RuntimeTemplates

    started: list[str] = []

    class Thread:
        def __init__(self, target, args, name, daemon) -> None:
            self.name = name

        def start(self) -> None:
            started.append(self.name)

    monkeypatch.setattr(runtimes.threading, "Thread", Thread)

    class Side:
        generation = 1

        def send_control(self, message) -> None:
            raise AssertionError("nothing was to start")

        runtime_slot = runtime_exit = runtime_failed = send_control

    policy = WorkerPolicy(runtimes={"0.8.0": "/nonexistent/python"})
    templates = RuntimeTemplates("org/a", policy, WorkerOptions(model_key="m"), Side(), ())
    for message in (Discard(pid=5), Park(pid=5, most_bytes=1)):
        templates.send("0.8.0", message)
    assert started == []
    templates.send("0.8.0", Fork(memory_cgroup=False, warm=False))
    assert started == ["runtime-0.8.0-org/a"]

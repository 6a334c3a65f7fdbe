"""A job's process may run its owner's next jobs, and never another user's (issue 23).

Each job in a fresh process paid a fork of the host, the containment set-up
and an exit per request, which on two cores halved the jobs per second of a
user's loop of small traces. A process that ran a job may now wait, stopped,
for the same user's next one (`replicas.parking`, ``jobs_per_process``). These
unit tests drive the slot bookkeeping with fake job processes: who gets which
process, what the host is told, and when a waiting process is ended. What
the kernel stops, and that another user never meets what a job left, is
shown with beaten Python against a real server in
`tests/security/test_isolation.py` (``TestTheSameUsersNextJob``).
"""

from __future__ import annotations

import threading

import pytest
from fakes import BareReplicaSide, FakeJobProcess

from nnhost.execution.events import JobSpec
from nnhost.execution.messages import Discard, Event, Park, Ready, Resume, Run
from nnhost.execution.policy import WorkerPolicy
from nnhost.models.adapters import ADAPTER_FILES
from nnhost.replicas import parking
from nnhost.replicas.slots import JobProcesses

pytestmark = pytest.mark.unit


@pytest.fixture
def made(tmp_path):
    """Replica-side job processes that may run 3 jobs of one user each, and what they told the host."""
    side = BareReplicaSide()
    jobs = JobProcesses("org/a", WorkerPolicy(), threading.RLock(), side,
                        on_job_event=lambda event: None, on_idle=lambda: None, on_incident=lambda kind: None)
    jobs.capacity, jobs.reuse = 2, 3
    processes: list[FakeJobProcess] = []

    def process(pid: int) -> FakeJobProcess:
        processes.append(FakeJobProcess(jobs, pid))
        return processes[-1]

    yield jobs, side, process
    for each in processes:
        each.close()


def _spec(tmp_path, n: int, owner: str) -> JobSpec:
    (tmp_path / f"payload-{n}").write_bytes(b"x")
    return JobSpec(f"{n:032d}", str(tmp_path / f"payload-{n}"), False, result_path=str(tmp_path / f"result-{n}"),
                   owner=owner)


def _finish(jobs: JobProcesses, process: FakeJobProcess, spec: JobSpec) -> None:
    assert jobs._slot_message(process.slot, Event(job_id=spec.job_id, status="RUNNING", description="r"), [])
    jobs._slot_message(process.slot, Event(job_id=spec.job_id, status="ERROR", description="e"), [])


def _runs(process: FakeJobProcess) -> list[tuple[str, bool]]:
    return [(m.job.job_id, m.stay_within > 0) for m in process.told() if isinstance(m, Run)]


def test_the_owners_next_job_goes_to_her_parked_process_and_nobody_elses(made, tmp_path):
    jobs, side, process = made
    a = process(101)
    first = _spec(tmp_path, 1, "alice")
    jobs.submit(first)
    assert _runs(a) == [(first.job_id, True)]  # she may send more: it may stay
    _finish(jobs, a, first)
    assert jobs.parking.settling == [a.slot] and not jobs.running
    assert jobs._slot_message(a.slot, Ready(), [])  # it put the model back: ready again
    assert jobs.parking.parked == [a.slot] and side.sent[-1] == Park(pid=101, most_bytes=parking.PARKED_BYTES)

    # Bob's job gets the spare, a process that has run nothing.
    b = process(102)
    bobs = _spec(tmp_path, 2, "bob")
    jobs.submit(bobs)
    assert _runs(b) == [(bobs.job_id, True)] and jobs.parking.parked == [a.slot]
    # Alice's next: her own process, resumed; the spare is not used (none asked for).
    c = process(103)
    asked = len([m for m in side.sent if not isinstance(m, (Park, Resume))])
    second = _spec(tmp_path, 3, "alice")
    jobs.submit(second)
    assert side.sent[-1] == Resume(pid=101) and _runs(a) == [(second.job_id, True)]
    assert jobs.spare is c.slot and _runs(c) == []
    assert len([m for m in side.sent if not isinstance(m, (Park, Resume))]) == asked

    # Her third job is the last this process may run: it ends with it.
    _finish(jobs, a, second)
    assert jobs._slot_message(a.slot, Ready(), [])
    third = _spec(tmp_path, 4, "alice")
    jobs.submit(third)
    assert _runs(a) == [(third.job_id, False)]
    _finish(jobs, a, third)
    assert side.sent[-1] == Discard(pid=101) and a.slot not in jobs.parking.parked + jobs.parking.settling


def test_a_job_without_an_owner_or_with_an_adapter_and_one_job_per_process_never_stay(made, tmp_path):
    jobs, side, process = made
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    for name in ADAPTER_FILES:
        (adapter_dir / name).write_bytes(b"{}")
    for n, (owner, adapter) in enumerate([("", ""), ("carol", str(adapter_dir))]):
        p = process(200 + n)
        spec = _spec(tmp_path, 10 + n, owner)
        spec.adapter_path = adapter
        jobs.submit(spec)
        assert _runs(p) == [(spec.job_id, False)]
        _finish(jobs, p, spec)
        assert side.sent[-1] == Discard(pid=200 + n)
    jobs.reuse = 1
    p = process(210)
    spec = _spec(tmp_path, 20, "dave")
    jobs.submit(spec)
    assert _runs(p) == [(spec.job_id, False)]


def test_after_its_job_anything_but_ready_ends_the_process(made, tmp_path):
    jobs, side, process = made
    a = process(301)
    spec = _spec(tmp_path, 30, "erin")
    jobs.submit(spec)
    _finish(jobs, a, spec)
    assert not jobs._slot_message(a.slot, Event(job_id=spec.job_id, status="LOG", description="x"), [])
    assert side.sent[-1] == Discard(pid=301)


def test_a_process_waits_only_so_long_and_only_so_many_wait(made, tmp_path, monkeypatch):
    jobs, side, process = made
    monkeypatch.setattr(parking, "PARKED_PER_REPLICA", 2)
    parked = []
    for n in range(3):
        p = process(400 + n)
        spec = _spec(tmp_path, 40 + n, f"user{n}")
        jobs.submit(spec)
        _finish(jobs, p, spec)
        assert jobs._slot_message(p.slot, Ready(), [])
        parked.append(p.slot)
    # The third to wait pushed out the first.
    assert jobs.parking.parked == parked[1:] and Discard(pid=400) in side.sent
    # One not ready again in time after its job, and the parked past their time, are ended.
    late = process(410)
    spec = _spec(tmp_path, 50, "user9")
    jobs.submit(spec)
    _finish(jobs, late, spec)
    now = late.slot.since
    jobs.expire(now + parking.SETTLE_SECONDS + 1)
    assert Discard(pid=410) in side.sent and jobs.parking.settling == [] and jobs.parking.parked == parked[1:]
    jobs.expire(parked[-1].since + parking.PARKED_SECONDS + 1)
    assert jobs.parking.parked == [] and {Discard(pid=401), Discard(pid=402)} <= set(side.sent)


def test_a_parked_process_is_weighed_by_its_job_groups_charge():
    """The host weighs a parked process by its job group's charge, its /tmp included (`parked.kept_bytes`).

    O(1) from the kernel, where walking its pages (smaps) took milliseconds of
    a CPU per park; a process in no job group of its own has no charge to read.
    """
    import os

    from nnhost.execution.os_layer.cgroups import JobGroups, group_memory

    groups = JobGroups("parking-test")
    if not groups.available:
        pytest.skip(f"no job groups here: {groups.problem}")
    assert group_memory(os.getpid()) is None
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: allocate once it is in its group, say so, and wait
        try:
            os.read(go_r, 1)
            kept = bytearray(os.urandom(40 << 20))
            os.write(done_w, b"1")
            os.read(go_r, 1)
            del kept
        finally:
            os._exit(0)
    try:
        groups.attach(pid, 512 << 20, 64)
        before = group_memory(pid)
        os.write(go_w, b"1")
        os.read(done_r, 1)
        after = group_memory(pid)
        assert before is not None and after is not None and after - before >= 40 << 20
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        groups.remove(pid)
        groups.close()


def test_a_replicas_groups_are_removed_when_it_stops_even_while_its_processes_exit():
    """`JobGroups.close` waits for a group's last process to go (left behind, a group per server)."""
    import os
    import signal
    import time

    from nnhost.execution.os_layer.cgroups import JobGroups

    groups = JobGroups("closing-test")
    if not groups.available:
        pytest.skip(f"no job groups here: {groups.problem}")
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    groups.attach(pid, 64 << 20, 16)
    os.kill(pid, signal.SIGKILL)  # as the host kills its job processes at a stop ...
    reaper = threading.Timer(0.3, os.waitpid, (pid, 0))  # ... and they are reaped a moment later
    reaper.start()
    try:
        groups.close()
        assert not os.path.exists(groups.memory_base), os.listdir(groups.memory_base)
    finally:
        reaper.join()


def test_groups_left_by_a_server_that_died_are_swept_when_the_next_starts():
    """A server killed outright cannot remove its groups; the next one removes them (`cgroups.sweep_stale`)."""
    import os

    from nnhost.execution.os_layer.cgroups import JobGroups

    probe = JobGroups("sweep-probe")
    if not probe.available:
        pytest.skip(f"no job groups here: {probe.problem}")
    parent = os.path.dirname(probe.memory_base)
    probe.close()
    dead = next(pid for pid in range(32000, 1000, -1) if not os.path.exists(f"/proc/{pid}"))
    left = os.path.join(parent, f"nnhost-{dead}-org-model")
    os.makedirs(os.path.join(left, f"job-{dead + 1}"))
    live = os.path.join(parent, f"nnhost-{os.getpid()}-still-running")
    os.makedirs(live)
    try:
        groups = JobGroups("sweeping-test")
        assert not os.path.exists(left)
        assert os.path.isdir(live)  # its server runs: never touched
        groups.close()
    finally:
        for path in (os.path.join(left, f"job-{dead + 1}"), left, live):
            if os.path.isdir(path):
                os.rmdir(path)

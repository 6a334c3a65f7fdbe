"""The job processes of a replica: handing each its job, reading its channel and log pipe, ending it.

`JobProcesses` is the collaborator of `replica.LocalReplica` that deals with
*slots*: processes that run one user's jobs (or, in trusted mode and on
accelerators, the host itself as one reusable slot). It owns them: which is
ready, which runs a job, which waits for its owner's next, which are still
awaited. It is given what it needs of its replica as a `ReplicaSide` (tell
the host, kill it, report), never the replica's own state. Up to
`JobProcesses.capacity` slots run a job at once, each in its own process (one,
for the reusable slot). One thread per slot reads its channel and its
stdout/stderr pipe; every message is checked (`job_watch`) before anything
reaches the server, and the slot is killed on anything unexpected.

A job's process that ran a job may run the same user's next ones, up to
`JobProcesses.reuse` in all, parked in between (`parking`): only a job of
the same owner (`JobSpec.owner`) is ever handed to it. Another user's job
always gets a process that has run nothing.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional, Protocol

from ..execution.channel import BadMessage, Channel, close_all
from ..execution.events import JobEvent, JobSpec, cut_description
from ..execution.handoff import discard_result, send_job
from ..execution.host.worker import crash_hint
from ..execution.job.process import describe_exit
from ..execution.messages import FROM_JOB, Discard, Fork, FromJob, Message, Park, Ready, Resume, Warm
from ..execution.messages import Slot as SlotMessage
from .incidents import Incident
from .job_watch import JobWatch, LogLines, Violation, refused
from .parking import PARKED_BYTES, Parking
from .process_slot import Slot

if TYPE_CHECKING:
    from ..execution.os_layer.cgroups import JobGroups
    from ..execution.policy import WorkerPolicy
    from .contract import OnIdle, OnIncident, OnJobEvent

log = logging.getLogger("nnhost.replica")


@dataclass
class Queued:
    """A job of another runtime that waits for its runtime's job process."""

    spec: JobSpec
    more_waiting: bool
    since: float


class ReplicaSide(Protocol):
    """What a replica's job processes need of the replica they serve (`replica.LocalReplica`)."""

    @property
    def stopping(self) -> bool:
        """The replica is stopping: no job process is wanted any more."""

    @property
    def generation(self) -> int:
        """Which host the replica runs now (a new one after a restart)."""

    @property
    def groups(self) -> Optional[JobGroups]:
        """The memory cgroups of its job processes (None: one process runs every job)."""

    @property
    def host_kill_reason(self) -> Optional[str]:
        """Why the host was killed, if it was (a reusable slot's job fails with it)."""

    def send_control(self, message: Message) -> None:
        """Tell the host (`execution.host.host`); nothing happens once it is gone."""

    def send_to(self, runtime: str, message: Message) -> None:
        """Tell what forks ``runtime``'s job processes: the host for its own (""), else that
        runtime's template (`replicas.runtimes`), started first if it is not running."""

    def retire(self, runtime: str) -> None:
        """Stop ``runtime``'s template: no job of it came for a while."""

    def kill_host(self, reason: Optional[str]) -> None:
        """Kill the host, which ran the job itself (a reusable slot), for ``reason``."""

    def unhealthy(self, description: str) -> None:
        """Report the replica UNHEALTHY."""

    def show_containment(self, slot: Slot) -> None:
        """Report the layers ``slot``'s process said it runs under."""


class JobProcesses:
    """A replica's job processes (*slots*): which is ready, which runs the job, and every word they say.

    It owns the slots and is given what it needs of its replica (`ReplicaSide`)
    and the replica's lock, which guards the state of both.
    """

    def __init__(self, name: str, policy: WorkerPolicy, lock: threading.RLock, replica: ReplicaSide, *,
                 on_job_event: OnJobEvent, on_idle: OnIdle, on_incident: OnIncident) -> None:
        self.name = name
        self.policy = policy
        self._lock = lock
        self._replica = replica
        self._on_job_event = on_job_event
        self._on_idle = on_idle
        self._on_incident = on_incident
        #: Every slot of the replica's hosts, by pid, until the host reports its exit.
        self.slots: dict[int, Slot] = {}
        #: The slot that is ready for the next job, and those running one, oldest first.
        self.spare: Optional[Slot] = None
        self.running: list[Slot] = []
        #: Processes that ran a job and may run their owner's next.
        self.parking = Parking()
        #: How many jobs may run at once (the replica sets it: one for a reusable slot).
        self.capacity = 1
        #: How many jobs of one user a job's process may run (the replica sets it).
        self.reuse = 1
        #: Job processes of this host that died before their first job, in a row.
        self.early_deaths = 0
        #: When a job process was asked for that is not ready yet (None: none is awaited).
        self.asked_at: Optional[float] = None
        #: The spare is to warm up once no job runs (none waited when it was asked for).
        self.warm_spare = False
        #: The ready job process of each other runtime that has one (`replicas.runtimes`).
        self.runtime_spares: dict[str, Slot] = {}
        #: Jobs of another runtime that wait for its job process (started on demand), oldest first.
        self.queued: dict[str, list[Queued]] = {}
        #: When each other runtime last ran a job (it is stopped once idle for long).
        self.runtime_used: dict[str, float] = {}
        #: Other runtimes whose next spare is to warm up once no job runs (`warm_spare`'s kin).
        self.warm_runtimes: set[str] = set()

    # -- what the replica asks -------------------------------------------------------------

    @property
    def has_room(self) -> bool:
        """Another job may start (the caller holds the lock)."""
        return len(self.running) + sum(len(waiting) for waiting in self.queued.values()) < self.capacity

    def running_job(self, job_id: str) -> Optional[Slot]:
        """The slot running ``job_id``, if one does (the caller holds the lock)."""
        return next((slot for slot in self.running if slot.job is not None and slot.job.job_id == job_id), None)

    def request_fork(self, warm: bool = True, runtime: str = "") -> None:
        """Ask the host (or ``runtime``'s template) for the next job process.

        ``warm``: one that warms up before it is ready.
        """
        if self.asked_at is None and not runtime:
            self.asked_at = time.monotonic()
        groups = self._replica.groups
        self._replica.send_to(runtime, Fork(memory_cgroup=bool(groups and groups.available), warm=warm))

    def submit(self, spec: JobSpec, more_waiting: bool = False) -> None:
        """Hand ``spec`` to its owner's parked process, or else to the spare slot.

        The caller holds the lock and checked there is a spare.
        ``more_waiting``: other jobs wait for this replica, so the next job
        process goes without a warm-up. Otherwise it warms up once this job
        has ended (`messages.Warm`), not beside it (see `job.process.live`).
        """
        slot = self.parking.take(spec.owner, spec.runtime)
        fresh = slot is None
        if spec.runtime:
            self.runtime_used[spec.runtime] = time.monotonic()
        if slot is None and spec.runtime:
            slot = self.runtime_spares.pop(spec.runtime, None)
            if slot is None:
                # Its runtime's job process comes first (and its template, if it stopped).
                first = spec.runtime not in self.queued
                self.queued.setdefault(spec.runtime, []).append(Queued(spec, more_waiting, time.monotonic()))
                if first:
                    self.request_fork(warm=False, runtime=spec.runtime)
                return
        elif slot is None:
            slot = self.spare
            assert slot is not None  # LocalReplica.submit checked
            self.spare = None
        else:
            self._replica.send_to(slot.runtime, Resume(pid=slot.pid))
        self._hand(slot, spec, fresh, more_waiting)

    def _hand(self, slot: Slot, spec: JobSpec, fresh: bool, more_waiting: bool) -> None:
        """Give ``spec`` to ``slot`` (the lock held), and ask for the next ready process."""
        slot.job, slot.watch = spec, JobWatch(spec)
        slot.lines = LogLines(spec.max_log_lines)
        slot.started = time.monotonic()
        slot.owner = spec.owner
        slot.jobs_run += 1
        # An adapter changes the model's modules for its job: that process goes.
        slot.staying = (not slot.reusable and bool(spec.owner) and not spec.adapter_path
                        and slot.jobs_run < self.reuse)
        self.running.append(slot)
        try:
            # The job's files travel as open descriptors: a contained
            # process cannot see the data directory (execution.handoff).
            send_job(slot.channel, spec, stay_within=PARKED_BYTES if slot.staying else 0)
        except Exception as error:
            # The slot died just now, the job's files are not there, or the
            # job does not fit the channel: whatever it is, it fails this job
            # (its reader reports the reason), never the replica.
            self.kill(slot, f"The server could not hand your request to its process ({error}).")
        if not slot.reusable and fresh and slot.runtime:
            if not more_waiting:
                self.warm_runtimes.add(slot.runtime)
            self.request_fork(warm=False, runtime=slot.runtime)
        elif not slot.reusable and fresh:
            # A warm-up costs a whole request's CPU: it pays only while no job
            # waits for the process it prepares, and only once this job is done.
            self.warm_spare = not more_waiting
            self.request_fork(warm=False)

    def expire(self, now: float) -> None:
        """Kill what waits too long for its owner's next job, fail what waits too long for
        its runtime, and stop a runtime idle for long (lock held)."""
        for slot in self.parking.expired(now):
            self.kill(slot, None)
        limit = self.policy.job_start_timeout
        for runtime, waiting in list(self.queued.items()):
            if waiting and now - waiting[0].since > limit:
                self.runtime_failed(runtime, f"No job process of the nnsight {runtime} runtime was ready "
                                             f"{limit:g} s after it was asked for (job_start_timeout).")
        idle = self.policy.runtime_idle
        for runtime, used in list(self.runtime_used.items()):
            if idle <= 0 or now - used <= idle or runtime in self.queued or any(
                    slot.runtime == runtime for slot in self.running + self.parking.parked + self.parking.settling):
                continue
            del self.runtime_used[runtime]
            spare = self.runtime_spares.pop(runtime, None)
            if spare is not None:
                self.kill(spare, None)
            self._replica.retire(runtime)

    def cancel_queued(self, job_id: str, description: str) -> bool:
        """End ``job_id`` if it waits for its runtime's process (lock held); whether it did."""
        for runtime, waiting in list(self.queued.items()):
            for entry in waiting:
                if entry.spec.job_id == job_id:
                    waiting.remove(entry)
                    if not waiting:
                        del self.queued[runtime]
                    self.fail_spec(entry.spec, description)
                    return True
        return False

    def runtime_failed(self, runtime: str, description: str) -> None:
        """``runtime`` cannot run jobs now: its waiting jobs fail, its spare goes (lock held)."""
        for waiting in self.queued.pop(runtime, []):
            self.fail_spec(waiting.spec, f"{description} You can resubmit your request.")
        spare = self.runtime_spares.pop(runtime, None)
        if spare is not None:
            self.kill(spare, None)
        self.runtime_used.pop(runtime, None)
        self.warm_runtimes.discard(runtime)

    def _settled(self, slot: Slot) -> None:
        """``slot`` said it is ready after its job: park it for its owner, or end it."""
        with self._lock:
            if not self.parking.settled(slot):
                return  # killed meanwhile (expired, or its replica stops)
            slot.job = slot.watch = slot.lines = None
            slot.staying = False
            if self._replica.stopping or slot.generation != self._replica.generation:
                self.kill(slot, None)
                return
            pushed_out = self.parking.park(slot, time.monotonic())
            # Stopped before anything else is said to the host: a Resume follows it.
            self._replica.send_to(slot.runtime, Park(pid=slot.pid, most_bytes=PARKED_BYTES))
            for old in pushed_out:
                self.kill(old, None)

    def add(self, message: SlotMessage, fds: list[int], generation: int, runtime: str = "") -> None:
        """A slot the host (or ``runtime``'s template) made (descriptors: its channel, its log pipe)."""
        slot = Slot(message.pid, Channel(socket.socket(fileno=fds[0])), fds[1] if len(fds) > 1 else -1,
                    reusable=message.reusable, generation=generation, runtime=runtime)
        close_all(fds[2:])
        with self._lock:
            self.slots[slot.pid] = slot
            groups = self._replica.groups
        if groups is not None and groups.available and not slot.reusable:
            # Outside the lock: moving a process into a group waits for the
            # kernel (milliseconds), and the lock is what a finishing job's
            # reader takes before it reports. This slot's own reader starts after.
            limits = self.policy.limits
            memory = (limits.memory_bytes or 8 << 30) + limits.scratch_bytes
            try:
                groups.attach(slot.pid, memory, limits.extra_tasks + 64)
            except OSError as error:
                with self._lock:
                    groups.problem = f"cannot use a cgroup: {error.strerror or error}"
                    self.kill(slot, None)
                    self.request_fork()  # the next one falls back to RLIMIT_AS
        threading.Thread(target=self._read_slot, args=(slot,), name=f"job-{self.name}", daemon=True).start()

    def exited(self, pid: int, status: int) -> None:
        """The host reaped the slot ``pid``."""
        with self._lock:
            slot = self.slots.pop(pid, None)
        if slot is None:
            return
        slot.exit_code = status
        groups = self._replica.groups
        if groups is not None and not slot.reusable:
            slot.out_of_memory = groups.ran_out_of_memory(slot.pid)
        slot.exited.set()
        if groups is not None and not slot.reusable:
            threading.Thread(target=groups.remove, args=(slot.pid,), daemon=True).start()

    def host_died(self, generation: int, reason: str) -> list[Slot]:
        """The host of ``generation`` is gone, and its slots with it: those that ran a job.

        The caller holds the lock.
        """
        slots = [s for s in self.slots.values() if s.generation == generation]
        self.slots = {p: s for p, s in self.slots.items() if s.generation != generation}
        self.spare = None
        self.warm_spare = False  # the next host's first process warms up before it is ready, or not at all
        self.runtime_spares.clear()
        self.runtime_used.clear()
        self.warm_runtimes.clear()
        for runtime in list(self.queued):
            self.runtime_failed(runtime, reason + " The model's worker was restarted.")
        running, self.running = self.running, []
        self.parking = Parking()
        for slot in slots:
            slot.kill_reason = slot.kill_reason or reason
            slot.exited.set()
        return running

    def waiting(self) -> list[Slot]:
        """The job processes forked and not ready yet."""
        return [slot for slot in self.slots.values() if not slot.ready and slot.job is None]

    # -- each slot's reader ----------------------------------------------------------------

    def _read_slot(self, slot: Slot) -> None:
        selector = selectors.DefaultSelector()
        selector.register(slot.channel.sock, selectors.EVENT_READ, "channel")
        if slot.log_fd >= 0:
            selector.register(slot.log_fd, selectors.EVENT_READ, "log")
        pending: list[str] = []
        try:
            while True:
                for key, _ in selector.select():
                    if key.data == "log":
                        data = _read_some(slot.log_fd)
                        if not data:
                            selector.unregister(slot.log_fd)
                            continue
                        self._log_bytes(slot, data, pending)
                        continue
                    # Read as the untrusted input it is: not one of the messages a
                    # job's process may send (descriptors included) is a violation.
                    try:
                        message, _ = FROM_JOB.receive(slot.channel)
                    except BadMessage as error:
                        self._violation(slot, refused(error))
                        return
                    except OSError:
                        message = None
                    if message is None:
                        return
                    if not self._slot_message(slot, message, pending):
                        return
        finally:
            selector.close()
            self._slot_gone(slot)

    def _slot_message(self, slot: Slot, message: FromJob, pending: list[str]) -> bool:
        """Handle one message; False once the slot is done with."""
        if slot.staying and slot.watch is not None and slot.watch.finished:
            # After its job, one that may stay says only that it is ready again.
            if not isinstance(message, Ready):
                self.kill(slot, None)
                return False
            self._settled(slot)
            return True
        if slot.job is None or (slot.reusable and slot.watch is not None and slot.watch.finished):
            # Before its job the process has run no user code: "ready" is the only
            # message it may send, once (a reusable slot: once after each job).
            if not isinstance(message, Ready) or slot.ready and not slot.reusable:
                self.kill(slot, None)
                return False
            slot.ready = True
            if slot.reusable:
                slot.job = slot.watch = None
            if message.containment is not None:
                slot.containment = dict(message.containment)
                self._replica.show_containment(slot)
            if slot.runtime:
                return self._runtime_ready(slot)
            with self._lock:
                if self.spare is None and not self._replica.stopping and (
                    not slot.reusable or not self.running
                ):
                    self.spare = slot
                    self.early_deaths = 0
                    self.asked_at = None
                    ready = True
                    self._warm_the_spare()
                else:
                    ready = False
            if ready:
                self._on_idle()
            else:
                self.kill(slot, None)
            return True
        assert slot.watch is not None  # set with its job (JobProcesses.submit)
        checked = slot.watch.check(message)
        if isinstance(checked, Violation):
            self._violation(slot, checked)
            return False
        if checked.status == "RUNNING":
            self._on_job_event(checked)
            for line in pending:
                self._on_job_event(JobEvent(slot.job.job_id, "LOG", line))
            pending.clear()
            return True
        if checked.final:
            self._drain_log(slot, pending)
            if checked.status == "ERROR":
                discard_result(slot.job)
                checked = self._with_memory_note(slot, checked)
            # Free before telling anyone: a client that has its result may at once ask
            # to evict the model, and must not find the replica still "busy".
            with self._lock:
                self._release(slot)
            self._on_job_event(checked)
            self._job_done(slot)
            return slot.reusable or slot.staying
        self._on_job_event(checked)
        return True

    def _runtime_ready(self, slot: Slot) -> bool:
        """Another runtime's job process is ready: the job that waits for it, or its runtime's spare."""
        with self._lock:
            if self._replica.stopping or slot.generation != self._replica.generation:
                self.kill(slot, None)
                return True
            waiting = self.queued.get(slot.runtime)
            if waiting:
                first = waiting.pop(0)
                if not waiting:
                    del self.queued[slot.runtime]
                self._hand(slot, first.spec, True, first.more_waiting)
                return True
            if slot.runtime in self.runtime_spares:
                self.kill(slot, None)
                return True
            self.runtime_spares[slot.runtime] = slot
            self._warm_the_spare()
        self._on_idle()
        return True

    def _log_bytes(self, slot: Slot, data: bytes, pending: list[str], draining: bool = False) -> None:
        if slot.jobs_run and (slot.job is None or slot.lines is None):
            return  # between two of its owner's jobs: theirs, and nobody's job now
        if slot.job is None or slot.lines is None:
            # Output of our own set-up, before any job: the server's business.
            text = data.decode("utf-8", "replace").strip()
            if text:
                log.warning("job process %s of %s: %s", slot.pid, self.name, text[-2000:])
            return
        assert slot.watch is not None  # set with its job and lines (JobProcesses.submit)
        if slot.watch.finished and not draining:
            return
        for line in slot.lines.feed(data):
            if slot.watch.running and not draining:
                self._on_job_event(JobEvent(slot.job.job_id, "LOG", line))
            elif len(pending) < 200 or draining:
                pending.append(line)

    def _drain_log(self, slot: Slot, pending: list[str]) -> None:
        """What the process wrote before its final event arrives before it (never after)."""
        if slot.log_fd < 0 or slot.lines is None:
            return
        os.set_blocking(slot.log_fd, False)
        try:
            while True:
                data = _read_some(slot.log_fd)
                if not data:
                    break
                self._log_bytes(slot, data, pending, draining=True)
        except BlockingIOError:
            pass
        finally:
            os.set_blocking(slot.log_fd, True)
        # Called once the job's final event is in: the slot has its job and watch.
        assert slot.job is not None and slot.watch is not None
        if slot.watch.running:
            for line in pending + slot.lines.close():
                self._on_job_event(JobEvent(slot.job.job_id, "LOG", line))
        pending.clear()

    def _job_done(self, slot: Slot) -> None:
        with self._lock:
            self._release(slot)
            if slot.staying and not self._replica.stopping:
                self.parking.settle(slot, time.monotonic())
            elif not slot.reusable:
                self.kill(slot, None)
            self._warm_the_spare()
        self._on_idle()

    def _release(self, slot: Slot) -> None:
        """``slot``'s job has ended: it no longer counts against the capacity (lock held)."""
        if slot in self.running:
            self.running.remove(slot)

    def _warm_the_spare(self) -> None:
        """A spare warms up now if no job runs and none waited when it was asked for (lock held).

        The server's own spare, and each other runtime's alike (`warm_runtimes`).
        """
        if self.running:
            return
        spares = []
        spare = self.spare
        if self.warm_spare and spare is not None and not spare.reusable and spare.job is None:
            self.warm_spare = False
            spares.append(spare)
        for runtime in sorted(self.warm_runtimes):
            spare = self.runtime_spares.get(runtime)
            if spare is not None and spare.job is None:
                self.warm_runtimes.discard(runtime)
                spares.append(spare)
        for spare in spares:
            try:
                spare.channel.send(Warm())
            except OSError:
                pass  # it died: its reader reports that

    def _violation(self, slot: Slot, why: str) -> None:
        with self._lock:
            job = slot.job
            if job is not None and slot.watch is not None and not slot.watch.finished:
                slot.watch.finished = True
                self._on_incident(Incident.PROTOCOL_VIOLATION)
                self.fail(
                    slot,
                    f"Your request's process broke the server's protocol ({why}), so it was "
                    "stopped. Nothing it sent was kept.",
                )
                self._release(slot)
            self.kill(slot, None)
        log.warning("job process %s of %s: %s", slot.pid, self.name, why)
        self._on_idle()

    def _slot_gone(self, slot: Slot) -> None:
        """The slot's channel closed: fail its job if it had not finished, say why."""
        slot.channel.close()
        if slot.log_fd >= 0:
            os.close(slot.log_fd)
            slot.log_fd = -1
        with self._lock:
            was_spare = self.spare is slot or self.runtime_spares.get(slot.runtime) is slot
            if self.spare is slot:
                self.spare = None
            if self.runtime_spares.get(slot.runtime) is slot:
                del self.runtime_spares[slot.runtime]
            self.parking.forget(slot)
        if slot.job is not None and slot.watch is not None and not slot.watch.finished:
            slot.watch.finished = True
            slot.exited.wait(2.0)
            reason = slot.kill_reason or self._replica.host_kill_reason
            if reason is None and not slot.out_of_memory:
                self._on_incident(Incident.JOB_PROCESS_DIED)
            elif slot.out_of_memory:
                self._on_incident(Incident.OUT_OF_MEMORY)
            if reason is None:
                code = slot.exit_code
                reason = f"Your request's process stopped ({describe_exit(code)})." + crash_hint(code)
                if slot.out_of_memory:
                    reason = f"{self._out_of_memory()} and was stopped. Use fewer or shorter inputs, or save less."
            self.fail(slot, f"{reason} You can resubmit your request.")
            with self._lock:
                self._release(slot)
            self._on_idle()
        elif slot.job is None and not slot.reusable and not self._replica.stopping:
            with self._lock:
                if slot.runtime and slot.runtime not in self.queued:
                    pass  # another runtime's process is forked for a job that waits, not ahead
                elif slot.generation == self._replica.generation and (was_spare or not slot.ready):
                    self.early_deaths += 1
                    if self.early_deaths <= 5:
                        self.request_fork(runtime=slot.runtime)
                    elif slot.runtime:
                        self.runtime_failed(slot.runtime, f"Job processes of the nnsight {slot.runtime} "
                                                          "runtime keep dying before their first job.")
                    else:
                        self._replica.unhealthy("Job processes keep dying before their first job; see the server log.")

    def _out_of_memory(self) -> str:
        limit = self.policy.limits.memory_bytes or 8 << 30
        return (
            "Your request ran out of the memory this server allows one request "
            f"({limit / (1 << 20):.0f} MiB, every kind of mapping counted)"
        )

    def _with_memory_note(self, slot: Slot, event: JobEvent) -> JobEvent:
        """An ERROR from a job that reached its memory limit says so.

        At the limit the kernel reclaims what it can before it kills, which can
        slow a job to its time limit: the error the job itself reports (a time
        limit, say) then hides the real cause.
        """
        groups = self._replica.groups
        if (
            groups is None or slot.reusable or "ran out of the memory" in event.description
            or not groups.reached_limit(slot.pid)
        ):
            return event
        note = f"\n{self._out_of_memory()} while it ran. Use fewer or shorter inputs, or save less."
        return replace(event, description=cut_description(event.description, note))

    def fail_spec(self, spec: JobSpec, description: str) -> None:
        """A job that never reached a process ends with ``description``."""
        discard_result(spec)
        self._on_job_event(JobEvent(spec.job_id, "ERROR", cut_description(description)))

    def fail(self, slot: Slot, description: str) -> None:
        assert slot.job is not None  # only a slot that was given a job fails one
        discard_result(slot.job)
        self._on_job_event(JobEvent(
            slot.job.job_id, "ERROR", cut_description(description),
            meta={"runtime": round(time.monotonic() - slot.started, 6)},
        ))

    def kill(self, slot: Slot, reason: Optional[str]) -> None:
        """End ``slot``'s process; its job, if it had not ended, fails with ``reason``."""
        if reason and not slot.kill_reason:
            slot.kill_reason = reason
        if slot.reusable:
            # The host runs the job itself: it is the process to replace.
            self._replica.kill_host(reason)
        else:
            self._replica.send_to(slot.runtime, Discard(pid=slot.pid))



def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        raise
    except OSError:
        return b""

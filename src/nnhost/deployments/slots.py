"""The job processes of a replica: reading each one's channel and log pipe, and ending it.

`JobProcesses` is the half of `LocalReplica` (a mixin) that deals with
*slots*: processes that run one job (or, in trusted mode and on accelerators,
the host itself as one reusable slot). One thread per slot reads its channel
and its stdout/stderr pipe; every message is checked (`job_watch`) before
anything reaches the server, and the slot is killed on anything unexpected.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..execution.channel import BadMessage, Channel
from ..execution.events import JobEvent, JobSpec, cut_description
from ..execution.handoff import discard_result
from ..execution.job_process import describe_exit
from ..execution.messages import FROM_JOB, Discard, FromJob, Message, Ready
from ..execution.worker import crash_hint
from .incidents import Incident
from .job_watch import JobWatch, LogLines, Violation, refused

if TYPE_CHECKING:
    import subprocess

    from ..execution.cgroups import JobGroups
    from ..execution.policy import WorkerPolicy
    from .contract import OnIdle, OnIncident, OnJobEvent

log = logging.getLogger("nnhost.replica")


@dataclass(eq=False)
class Slot:
    """A process that runs (or will run) one job."""

    pid: int
    channel: Channel
    log_fd: int = -1
    reusable: bool = False
    generation: int = 0
    ready: bool = False
    containment: Optional[dict[str, Any]] = None
    job: Optional[JobSpec] = None
    watch: Optional[JobWatch] = None
    lines: Optional[LogLines] = None
    started: float = 0.0
    kill_reason: Optional[str] = None
    exit_code: Optional[int] = None
    out_of_memory: bool = False
    exited: threading.Event = field(default_factory=threading.Event)



class JobProcesses:
    """Slot handling for `LocalReplica` (which provides the state and callbacks used here)."""

    # What LocalReplica provides, declared so that the code here is checked against it.
    name: str
    policy: WorkerPolicy
    _lock: threading.RLock
    _spare: Optional[Slot]
    _current: Optional[Slot]
    _host: Optional[subprocess.Popen[bytes]]
    _kill_reason: Optional[str]
    _stopping: bool
    _generation: int
    _early_deaths: int
    _asked_at: Optional[float]
    _on_job_event: OnJobEvent
    _on_idle: OnIdle
    _on_incident: OnIncident
    _show_containment: Callable[[Slot], None]
    _send_control: Callable[[Message], None]
    _request_fork: Callable[[], None]
    _unhealthy: Callable[[str], None]
    _groups: Optional[JobGroups]

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
        if slot.job is None or (slot.reusable and slot.watch is not None and slot.watch.finished):
            # Before its job the process has run no user code: "ready" is the only
            # message it may send, once (a reusable slot: once after each job).
            if not isinstance(message, Ready) or slot.ready and not slot.reusable:
                self._kill_slot(slot, None)
                return False
            slot.ready = True
            if slot.reusable:
                slot.job = slot.watch = None
            if message.containment is not None:
                slot.containment = dict(message.containment)
                self._show_containment(slot)
            with self._lock:
                if self._spare is None and not self._stopping and (
                    not slot.reusable or self._current is None
                ):
                    self._spare = slot
                    self._early_deaths = 0
                    self._asked_at = None
                    ready = True
                else:
                    ready = False
            if ready:
                self._on_idle()
            else:
                self._kill_slot(slot, None)
            return True
        assert slot.watch is not None  # set with its job (LocalReplica.submit)
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
                if self._current is slot:
                    self._current = None
            self._on_job_event(checked)
            self._job_done(slot)
            return slot.reusable
        self._on_job_event(checked)
        return True

    def _log_bytes(self, slot: Slot, data: bytes, pending: list[str], draining: bool = False) -> None:
        if slot.job is None or slot.lines is None:
            # Output of our own set-up, before any job: the server's business.
            text = data.decode("utf-8", "replace").strip()
            if text:
                log.warning("job process %s of %s: %s", slot.pid, self.name, text[-2000:])
            return
        assert slot.watch is not None  # set with its job and lines (LocalReplica.submit)
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
            if self._current is slot:
                self._current = None
            if not slot.reusable:
                self._kill_slot(slot, None)
        self._on_idle()

    def _violation(self, slot: Slot, why: str) -> None:
        with self._lock:
            job = slot.job
            if job is not None and slot.watch is not None and not slot.watch.finished:
                slot.watch.finished = True
                self._on_incident(Incident.PROTOCOL_VIOLATION)
                self._fail(
                    slot,
                    f"Your request's process broke the server's protocol ({why}), so it was "
                    "stopped. Nothing it sent was kept.",
                )
                if self._current is slot:
                    self._current = None
            self._kill_slot(slot, None)
        log.warning("job process %s of %s: %s", slot.pid, self.name, why)
        self._on_idle()

    def _slot_gone(self, slot: Slot) -> None:
        """The slot's channel closed: fail its job if it had not finished, say why."""
        slot.channel.close()
        if slot.log_fd >= 0:
            os.close(slot.log_fd)
            slot.log_fd = -1
        with self._lock:
            was_spare = self._spare is slot
            if was_spare:
                self._spare = None
        if slot.job is not None and slot.watch is not None and not slot.watch.finished:
            slot.watch.finished = True
            slot.exited.wait(2.0)
            reason = slot.kill_reason or self._kill_reason
            if reason is None and not slot.out_of_memory:
                self._on_incident(Incident.JOB_PROCESS_DIED)
            elif slot.out_of_memory:
                self._on_incident(Incident.OUT_OF_MEMORY)
            if reason is None:
                code = slot.exit_code
                reason = f"Your request's process stopped ({describe_exit(code)})." + crash_hint(code)
                if slot.out_of_memory:
                    reason = f"{self._out_of_memory()} and was stopped. Use fewer or shorter inputs, or save less."
            self._fail(slot, f"{reason} You can resubmit your request.")
            with self._lock:
                if self._current is slot:
                    self._current = None
            self._on_idle()
        elif slot.job is None and not slot.reusable and not self._stopping:
            with self._lock:
                if slot.generation == self._generation and (was_spare or not slot.ready):
                    self._early_deaths += 1
                    if self._early_deaths <= 5:
                        self._request_fork()
                    else:
                        self._unhealthy("Job processes keep dying before their first job; see the server log.")

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
        groups = self._groups
        if (
            groups is None or slot.reusable or "ran out of the memory" in event.description
            or not groups.reached_limit(slot.pid)
        ):
            return event
        note = f"\n{self._out_of_memory()} while it ran. Use fewer or shorter inputs, or save less."
        return replace(event, description=cut_description(event.description, note))

    def _fail(self, slot: Slot, description: str) -> None:
        assert slot.job is not None  # only a slot that was given a job fails one
        discard_result(slot.job)
        self._on_job_event(JobEvent(
            slot.job.job_id, "ERROR", cut_description(description),
            meta={"runtime": round(time.monotonic() - slot.started, 6)},
        ))

    def _kill_slot(self, slot: Slot, reason: Optional[str]) -> None:
        if reason and not slot.kill_reason:
            slot.kill_reason = reason
        if slot.reusable:
            # The host runs the job itself: it is the process to replace.
            self._kill_reason = reason or self._kill_reason
            if self._host is not None and self._host.poll() is None:
                self._host.kill()
        else:
            self._send_control(Discard(pid=slot.pid))



def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        raise
    except OSError:
        return b""

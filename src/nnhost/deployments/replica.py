"""A replica: one loaded copy of a model, and the processes that run its jobs.

`Replica` is the seam the rest of nnhost programs against: ``start``,
``submit``, ``cancel``, ``stop``, ``health``, plus a stream of events delivered
to the callbacks it was built with. `LocalReplica` implements it on this
machine with a host process (`execution.host`) that loads the model and never
runs user code. In fork mode the host keeps one job process forked and
contained ahead of time; `LocalReplica` hands each job to such a *slot* over
the slot's own channel, together with the job's two open files, and the slot
is killed when the job ends: no process runs a second job. (In trusted mode
and on accelerators the host itself is one reusable slot.)

Everything a slot says is checked (`job_watch`): the replica forwards only
the events of the job it gave that slot, in order, and fails the job with a
clear ERROR, killing the slot, on anything else, on silence past the time
limit plus the grace, and when the slot dies. Its stdout and stderr arrive on
a pipe of their own and become that job's LOG lines. Each slot gets a memory
and task cgroup (`execution.cgroups`) before its job. A host that dies fails
the running job with the reason and is restarted.

Callbacks run on the replica's own threads; the caller hops them onto its
event loop. All processes are started from long-lived threads (a parent-death
signal follows the thread that forked, not the process).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Protocol

from ..execution.cgroups import JobGroups
from ..execution.channel import BadMessage, Channel, close_all, pair
from ..execution.events import JobEvent, JobSpec
from ..execution.handoff import discard_result, send_job
from ..execution.job_process import describe_exit
from ..execution.policy import WorkerPolicy
from ..execution.worker import WorkerOptions, crash_hint
from .job_watch import JobWatch, LogLines, Violation

log = logging.getLogger("nnhost.replica")

#: Only these reach the host process's environment (it gets nothing else of the server's).
HOST_ENVIRONMENT = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME",
                    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM")


@dataclass
class ReplicaState:
    """What a replica reports about itself (application state, as /status names it)."""

    state: str  # NOT_STARTED, DEPLOYING, RUNNING, UNHEALTHY
    description: str = ""
    weight_bytes: Optional[int] = None
    #: Which containment layers the processes run under (see execution.containment).
    containment: Optional[dict] = None


OnJobEvent = Callable[[JobEvent], None]
OnState = Callable[[ReplicaState], None]
OnIdle = Callable[[], None]


class Replica(Protocol):
    def start(self) -> None: ...
    def submit(self, spec: JobSpec) -> None: ...
    def cancel(self, job_id: str) -> bool: ...
    def stop(self) -> None: ...
    def health(self) -> ReplicaState: ...
    @property
    def busy(self) -> bool: ...


def _signal_name(exitcode: Optional[int]) -> str:
    return describe_exit(exitcode)


@dataclass(eq=False)
class _Slot:
    """A process that runs (or will run) one job."""

    pid: int
    channel: Channel
    log_fd: int = -1
    reusable: bool = False
    generation: int = 0
    ready: bool = False
    containment: Optional[dict] = None
    job: Optional[JobSpec] = None
    watch: Optional[JobWatch] = None
    lines: Optional[LogLines] = None
    started: float = 0.0
    kill_reason: Optional[str] = None
    exit_code: Optional[int] = None
    out_of_memory: bool = False
    exited: threading.Event = field(default_factory=threading.Event)


class LocalReplica:
    """A replica backed by a host process and its job processes on this machine."""

    def __init__(
        self,
        name: str,
        options: WorkerOptions,
        *,
        on_job_event: OnJobEvent,
        on_state: OnState,
        on_idle: OnIdle,
        kill_grace: float = 10.0,
        restart_delay: float = 1.0,
    ) -> None:
        self.name = name
        self.options = options
        self._on_job_event = on_job_event
        self._on_state = on_state
        self._on_idle = on_idle
        self._kill_grace = kill_grace
        self._restart_delay = restart_delay
        self.policy = WorkerPolicy.from_environ(dict(options.environ))
        self._lock = threading.RLock()
        self._host: Optional[subprocess.Popen] = None
        self._control: Optional[Channel] = None
        self._state = ReplicaState("NOT_STARTED", "Not started.")
        self._host_containment: Optional[dict] = None
        self._slots: dict[int, _Slot] = {}
        self._spare: Optional[_Slot] = None
        self._current: Optional[_Slot] = None
        self._kill_reason: Optional[str] = None
        self._stopping = False
        self._generation = 0
        self._restart_at: Optional[float] = None
        self._early_deaths = 0
        self._groups: Optional[JobGroups] = None
        self._watchdog: Optional[threading.Thread] = None

    # -- the Replica seam ------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._current is not None or self._spare is None

    def health(self) -> ReplicaState:
        return self._state

    @property
    def pid(self) -> Optional[int]:
        host = self._host
        return host.pid if host is not None and host.poll() is None else None

    def place(self, device: str) -> None:
        """Move the weights (HOT on the model's device, WARM in host memory)."""
        with self._lock:
            self.options.device = device
            if self._control is not None and self._state.state == "RUNNING":
                self._send_control({"type": "place", "device": device})

    def start(self) -> None:
        with self._lock:
            self._stopping = False
            if self._groups is None and self.policy.containment and self.options.home_device == "cpu":
                self._groups = JobGroups(self.name)
            self._spawn()
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name=f"watchdog-{self.name}", daemon=True)
            self._watchdog.start()

    def submit(self, spec: JobSpec) -> None:
        with self._lock:
            if self._current is not None:
                raise RuntimeError(f"replica {self.name} is busy with {self._current.job.job_id}")
            slot = self._spare
            if self._state.state != "RUNNING" or slot is None:
                raise RuntimeError(f"replica {self.name} is not ready ({self._state.state})")
            self._spare = None
            slot.job, slot.watch = spec, JobWatch(spec)
            slot.lines = LogLines(spec.max_log_lines)
            slot.started = time.monotonic()
            self._current = slot
            try:
                # The job's files travel as open descriptors: a contained
                # process cannot see the data directory (execution.handoff).
                send_job(slot.channel, spec)
            except OSError as error:
                # The slot died just now, or the job's files are not there:
                # either way its reader fails the job, with this reason.
                self._kill_slot(slot, f"The server could not hand your request to its process ({error}).")
            if not slot.reusable:
                self._request_fork()

    def cancel(self, job_id: str) -> bool:
        with self._lock:
            slot = self._current
            if slot is None or slot.job is None or slot.job.job_id != job_id:
                return False
            self._kill_slot(slot, "Your request was cancelled while it was running.")
            return True

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._restart_at = None
            host = self._host
            self._send_control({"type": "stop"})
        if host is not None:
            try:
                host.wait(timeout=5)
            except subprocess.TimeoutExpired:
                host.kill()
                host.wait(timeout=5)
        if self._groups is not None:
            self._groups.close()
            self._groups = None
        self._set_state(ReplicaState("NOT_STARTED", "Stopped."))

    # -- the host process -------------------------------------------------------

    def _spawn(self) -> None:
        ours, theirs = pair()
        env = {key: os.environ[key] for key in HOST_ENVIRONMENT if key in os.environ}
        # A clean exec: the host's argv and environment never held the server's
        # (no --api-key, no NNHOST_* secrets); the model's settings come over the channel.
        host = subprocess.Popen(
            [sys.executable, "-m", "nnhost.execution.host", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, close_fds=True,
        )
        theirs.close()
        control = Channel(ours)
        control.send({"type": "options", "options": asdict(self.options)})
        self._generation += 1
        self._host, self._control = host, control
        self._kill_reason = None
        self._host_containment = None
        self._set_state(ReplicaState("DEPLOYING", "Starting the worker process."))
        threading.Thread(
            target=self._read_control, args=(control, host, self._generation),
            name=f"host-{self.name}", daemon=True,
        ).start()

    def _send_control(self, message: dict) -> None:
        if self._control is None:
            return
        try:
            self._control.send(message)
        except OSError:
            pass

    def _request_fork(self) -> None:
        self._send_control({"type": "fork", "memory_cgroup": bool(self._groups and self._groups.available)})

    def _read_control(self, control: Channel, host: subprocess.Popen, generation: int) -> None:
        asked_first = False
        while True:
            try:
                message, fds = control.recv()
            except (OSError, BadMessage):
                message, fds = None, []
            if message is None:
                break
            kind = message.get("type")
            if kind == "state":
                fields = {k: message.get(k) for k in ("state", "description", "weight_bytes", "containment")}
                if fields["containment"]:
                    self._host_containment = fields["containment"]
                fields["containment"] = self._containment()
                self._set_state(ReplicaState(**{k: v for k, v in fields.items() if v is not None}))
                if fields["state"] == "RUNNING" and not asked_first:
                    asked_first = True
                    with self._lock:
                        self._request_fork()
            elif kind == "slot" and fds:
                self._add_slot(message, fds, generation)
            elif kind == "exit":
                self._slot_exited(message.get("pid"), message.get("status"))
            else:
                close_all(fds)
        try:
            host.wait(timeout=10)
        except subprocess.TimeoutExpired:
            host.kill()
            host.wait()
        self._host_died(host, generation)

    def _add_slot(self, message: dict, fds: list, generation: int) -> None:
        pid = message.get("pid")
        slot = _Slot(int(pid), Channel(_socket(fds[0])), fds[1] if len(fds) > 1 else -1,
                     reusable=bool(message.get("reusable")), generation=generation)
        close_all(fds[2:])
        with self._lock:
            self._slots[slot.pid] = slot
            if self._groups is not None and self._groups.available and not slot.reusable:
                limits = self.policy.limits
                memory = (limits.memory_bytes or 8 << 30) + limits.scratch_bytes
                try:
                    self._groups.attach(slot.pid, memory, limits.extra_tasks + 64)
                except OSError as error:
                    self._groups.problem = f"cannot use a cgroup: {error.strerror or error}"
                    self._kill_slot(slot, None)
                    self._request_fork()  # the next one falls back to RLIMIT_AS
        threading.Thread(target=self._read_slot, args=(slot,), name=f"job-{self.name}", daemon=True).start()

    def _slot_exited(self, pid: Any, status: Any) -> None:
        with self._lock:
            slot = self._slots.pop(pid, None) if isinstance(pid, int) else None
        if slot is None:
            return
        slot.exit_code = status if isinstance(status, int) else None
        groups = self._groups
        if groups is not None and not slot.reusable:
            slot.out_of_memory = groups.ran_out_of_memory(slot.pid)
        slot.exited.set()
        if groups is not None and not slot.reusable:
            threading.Thread(target=groups.remove, args=(slot.pid,), daemon=True).start()

    def _host_died(self, host: subprocess.Popen, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return
            slots = [s for s in self._slots.values() if s.generation == generation]
            self._slots = {p: s for p, s in self._slots.items() if s.generation != generation}
            self._spare = None
            reason = self._kill_reason or (
                f"The worker process stopped ({_signal_name(host.returncode)})." + crash_hint(host.returncode)
            )
            current, self._current = self._current, None
            stopping = self._stopping
            unhealthy_at_load = self._state.state == "UNHEALTHY"
            for slot in slots:
                slot.kill_reason = slot.kill_reason or reason
                slot.exited.set()
        if current is not None and current.job is not None and not current.watch.finished:
            current.watch.finished = True
            self._fail(current, f"{reason} The model's worker was restarted; you can resubmit your request.")
        if stopping or unhealthy_at_load:
            return
        self._set_state(ReplicaState("DEPLOYING", f"{reason} Restarting the worker."))
        with self._lock:
            self._restart_at = time.monotonic() + self._restart_delay
        if current is not None:
            self._on_idle()

    # -- job processes -------------------------------------------------------------

    def _read_slot(self, slot: _Slot) -> None:
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
                    try:
                        message, fds = slot.channel.recv()
                    except BadMessage as error:
                        self._violation(slot, Violation(f"it sent {error}"))
                        return
                    except OSError:
                        message, fds = None, []
                    if message is None:
                        return
                    if fds:  # a job's process has no business sending descriptors
                        close_all(fds)
                        self._violation(slot, Violation("it sent file descriptors"))
                        return
                    if not self._slot_message(slot, message, pending):
                        return
        finally:
            selector.close()
            self._slot_gone(slot)

    def _slot_message(self, slot: _Slot, message: dict, pending: list) -> bool:
        """Handle one message; False once the slot is done with."""
        if slot.job is None or (slot.reusable and slot.watch is not None and slot.watch.finished):
            # Before its job the process has run no user code: "ready" is the only
            # message it may send, once (a reusable slot: once after each job).
            if message.get("type") != "ready" or slot.ready and not slot.reusable:
                self._kill_slot(slot, None)
                return False
            slot.ready = True
            if slot.reusable:
                slot.job = slot.watch = None
            if isinstance(message.get("containment"), dict):
                slot.containment = message["containment"]
                self._set_state(ReplicaState(**{**asdict(self._state), "containment": self._containment(slot)}))
            with self._lock:
                if self._spare is None and not self._stopping and (
                    not slot.reusable or self._current is None
                ):
                    self._spare = slot
                    self._early_deaths = 0
                    ready = True
                else:
                    ready = False
            if ready:
                self._on_idle()
            else:
                self._kill_slot(slot, None)
            return True
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
        if checked.status in ("COMPLETED", "ERROR"):
            self._drain_log(slot, pending)
            if checked.status == "ERROR":
                discard_result(slot.job)
            self._on_job_event(checked)
            self._job_done(slot)
            return slot.reusable
        self._on_job_event(checked)
        return True

    def _log_bytes(self, slot: _Slot, data: bytes, pending: list, draining: bool = False) -> None:
        if slot.job is None or slot.lines is None:
            # Output of our own set-up, before any job: the server's business.
            text = data.decode("utf-8", "replace").strip()
            if text:
                log.warning("job process %s of %s: %s", slot.pid, self.name, text[-2000:])
            return
        if slot.watch.finished and not draining:
            return
        for line in slot.lines.feed(data):
            if slot.watch.running and not draining:
                self._on_job_event(JobEvent(slot.job.job_id, "LOG", line))
            elif len(pending) < 200 or draining:
                pending.append(line)

    def _drain_log(self, slot: _Slot, pending: list) -> None:
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
        if slot.watch.running:
            for line in pending + slot.lines.close():
                self._on_job_event(JobEvent(slot.job.job_id, "LOG", line))
        pending.clear()

    def _job_done(self, slot: _Slot) -> None:
        with self._lock:
            if self._current is slot:
                self._current = None
            if not slot.reusable:
                self._kill_slot(slot, None)
        self._on_idle()

    def _violation(self, slot: _Slot, why: str) -> None:
        with self._lock:
            job = slot.job
            if job is not None and slot.watch is not None and not slot.watch.finished:
                slot.watch.finished = True
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

    def _slot_gone(self, slot: _Slot) -> None:
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
            if reason is None:
                code = slot.exit_code
                reason = f"Your request's process stopped ({_signal_name(code)})." + crash_hint(code)
                if slot.out_of_memory:
                    limit = self.policy.limits.memory_bytes or 8 << 30
                    reason = (
                        "Your request ran out of the memory this server allows one request "
                        f"({limit / (1 << 20):.0f} MiB, every kind of mapping counted) and was "
                        "stopped. Use fewer or shorter inputs, or save less."
                    )
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
                        self._set_state(ReplicaState(
                            "UNHEALTHY", "Job processes keep dying before their first job; see the server log.",
                            containment=self._containment()))

    def _fail(self, slot: _Slot, description: str) -> None:
        discard_result(slot.job)
        self._on_job_event(JobEvent(
            slot.job.job_id, "ERROR", description,
            meta={"runtime": round(time.monotonic() - slot.started, 6)},
        ))

    def _kill_slot(self, slot: _Slot, reason: Optional[str]) -> None:
        if reason and not slot.kill_reason:
            slot.kill_reason = reason
        if slot.reusable:
            # The host runs the job itself: it is the process to replace.
            self._kill_reason = reason or self._kill_reason
            if self._host is not None and self._host.poll() is None:
                self._host.kill()
        else:
            self._send_control({"type": "discard", "pid": slot.pid})

    # -- time limits and restarts ---------------------------------------------------

    def _watch(self) -> None:
        """Kill a job that overran its time limit by more than the grace; restart a dead host."""
        while True:
            time.sleep(0.25)
            with self._lock:
                if self._restart_at is not None and time.monotonic() >= self._restart_at:
                    self._restart_at = None
                    if not self._stopping:
                        self._spawn()
                slot = self._current
                if slot is None or slot.job is None or slot.kill_reason:
                    continue
                job = slot.job
                if job.time_limit <= 0:
                    continue
                if time.monotonic() - slot.started - job.time_limit > self._kill_grace:
                    self._kill_slot(slot, (
                        f"Your request exceeded this server's time limit of "
                        f"{job.time_limit:g} seconds and did not stop when interrupted, "
                        "so its worker process was killed."
                    ))

    def _containment(self, slot: Optional[_Slot] = None) -> Optional[dict]:
        """The layers every job runs under: the host's, a job process's own, the cgroup."""
        host = self._host_containment
        if host is None:
            return None
        report = {"enabled": host.get("enabled", True), "active": list(host.get("active", [])),
                  "unavailable": dict(host.get("unavailable", {}))}
        job = slot.containment if slot is not None else self._state.containment
        if self._groups is None:
            report["mode"] = "one process for every job"
            return report
        report["mode"] = "a fresh process per job"
        if job:
            for name in job.get("active", []):
                if name not in report["active"]:
                    report["active"].append(name)
                report["unavailable"].pop(name, None)
            for name, why in job.get("unavailable", {}).items():
                if name not in report["active"]:
                    report["unavailable"][name] = why
        if self._groups.available:
            report["active"].append("memory cgroup") if "memory cgroup" not in report["active"] else None
        else:
            report["unavailable"]["memory cgroup"] = f"{self._groups.problem}; RLIMIT_AS instead"
        return report

    def _set_state(self, state: ReplicaState) -> None:
        self._state = state
        self._on_state(state)


def _socket(fd: int) -> Any:
    import socket

    return socket.socket(fileno=fd)


def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        raise
    except OSError:
        return b""

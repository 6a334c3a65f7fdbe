"""A replica: one loaded copy of a model, and the processes that run its jobs.

`contract.Replica` is the seam the rest of nnhost programs against: ``start``,
``submit``, ``cancel``, ``stop``, ``health``, ``place``, plus a stream of events
delivered to the callbacks it was built with. `LocalReplica` implements it on this
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
import subprocess
import threading
import time
from dataclasses import asdict
from typing import Any, Optional

from ..execution.cgroups import JobGroups
from ..execution.channel import BadMessage, Channel, close_all
from ..execution.events import JobSpec
from ..execution.handoff import send_job
from ..execution.job_process import describe_exit
from ..execution.messages import FROM_HOST, Exit, Fork, Message, Options, Place, State, Stop
from ..execution.messages import Slot as SlotMessage
from ..execution.policy import Design, WorkerPolicy
from ..execution.worker import WorkerOptions, crash_hint
from .contract import OnIdle, OnIncident, OnJobEvent, OnState, ReplicaState, ReplicaStatus
from .incidents import Incident
from .job_watch import JobWatch, LogLines
from .slots import JobProcesses, Slot
from .spare_hosts import SPARES, clean_environment, start_host
from .stuck import process_snapshot

log = logging.getLogger("nnhost.replica")

#: Only these reach the host process's environment (it gets nothing else of the server's).
HOST_ENVIRONMENT = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME",
                    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM",
                    # The GPUs this process was given (by Ray for its actor, or by the
                    # operator): the model's cuda:N are those, not the node's first ones.
                    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _signal_name(exitcode: Optional[int]) -> str:
    return describe_exit(exitcode)


class LocalReplica(JobProcesses):
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
        on_incident: OnIncident = lambda kind: None,
        needs: Optional[dict[str, int]] = None,  # this machine's budgets already account for it
    ) -> None:
        self.name = name
        self._on_incident = on_incident
        self.options = options
        self._on_job_event = on_job_event
        self._on_state = on_state
        self._on_idle = on_idle
        self._kill_grace = kill_grace
        self._restart_delay = restart_delay
        self.policy = WorkerPolicy.from_environ(dict(options.environ))
        self._lock = threading.RLock()
        self._host: Optional[subprocess.Popen[bytes]] = None
        self._control: Optional[Channel] = None
        self._state = ReplicaState(ReplicaStatus.NOT_STARTED, "Not started.")
        self._host_containment: Optional[dict[str, Any]] = None
        self._slots: dict[int, Slot] = {}
        self._spare: Optional[Slot] = None
        self._current: Optional[Slot] = None
        self._kill_reason: Optional[str] = None
        self._stopping = False
        self._generation = 0
        self._restart_at: Optional[float] = None
        self._early_deaths = 0
        #: When a job process was asked for that is not ready yet (None: none is awaited).
        self._asked_at: Optional[float] = None
        self._groups: Optional[JobGroups] = None
        self._watchdog: Optional[threading.Thread] = None

    # -- the Replica seam ------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Running a job (eviction and the queue's estimates ask this)."""
        return self._current is not None

    @property
    def accepting(self) -> bool:
        """Free, with a job process forked and contained, waiting for a job."""
        return self._current is None and self._spare is not None

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
            if self._control is not None and self._state.state is ReplicaStatus.RUNNING:
                self._send_control(Place(device=device))

    def start(self) -> None:
        with self._lock:
            self._stopping = False
            # A process per job (fork or mapped design): each gets a memory group.
            if self._groups is None and self.policy.design(self.options.home_device) is not Design.IN_PROCESS:
                self._groups = JobGroups(self.name)
            self._spawn()
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name=f"watchdog-{self.name}", daemon=True)
            self._watchdog.start()

    def submit(self, spec: JobSpec) -> None:
        with self._lock:
            if self._current is not None:
                assert self._current.job is not None  # the current slot is the one running a job
                raise RuntimeError(f"replica {self.name} is busy with {self._current.job.job_id}")
            slot = self._spare
            if self._state.state is not ReplicaStatus.RUNNING or slot is None:
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
            except Exception as error:
                # The slot died just now, the job's files are not there, or the
                # job does not fit the channel: whatever it is, it fails this job
                # (its reader reports the reason), never the replica.
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
            self._send_control(Stop())
        if host is not None:
            try:
                host.wait(timeout=5)
            except subprocess.TimeoutExpired:
                host.kill()
                host.wait(timeout=5)
        if self._groups is not None:
            self._groups.close()
            self._groups = None
        self._set_state(ReplicaState(ReplicaStatus.NOT_STARTED, "Stopped."))

    # -- the host process -------------------------------------------------------

    def _spawn(self) -> None:
        # A clean exec: the host's argv and environment never held the server's
        # (no --api-key, no NNHOST_* secrets); the model's settings come over the channel.
        env = clean_environment(HOST_ENVIRONMENT)
        environ = dict(self.options.environ)
        started = SPARES.take(env, environ) or start_host(env, environ)
        host, control = started
        control.send(Options(options=self.options))
        SPARES.keep(env, environ, self.policy.spare_hosts)
        self._generation += 1
        self._asked_at = None
        self._host, self._control = host, control
        self._kill_reason = None
        self._host_containment = None
        self._set_state(ReplicaState(ReplicaStatus.DEPLOYING, "Starting the worker process."))
        threading.Thread(
            target=self._read_control, args=(control, host, self._generation),
            name=f"host-{self.name}", daemon=True,
        ).start()

    def _send_control(self, message: Message) -> None:
        if self._control is None:
            return
        try:
            self._control.send(message)
        except OSError:
            pass

    def _request_fork(self) -> None:
        if self._asked_at is None:
            self._asked_at = time.monotonic()
        self._send_control(Fork(memory_cgroup=bool(self._groups and self._groups.available)))

    def _read_control(self, control: Channel, host: subprocess.Popen[bytes], generation: int) -> None:
        asked_first = False
        while True:
            try:
                raw, fds = control.recv()
            except (OSError, BadMessage):
                raw, fds = None, []
            if raw is None:
                break
            try:
                message = FROM_HOST.parse(raw)
            except BadMessage as error:
                # Our own host's mistake, not a job's: said, and passed over.
                close_all(fds)
                log.warning("the worker of %s sent %s", self.name, error)
                continue
            if isinstance(message, State):
                if message.containment:
                    self._host_containment = message.containment
                description = message.description
                try:
                    status = ReplicaStatus(message.state)
                except ValueError:
                    status, description = ReplicaStatus.UNHEALTHY, (
                        f"The worker reported an unknown state ({message.state[:40]!r}).")
                self._set_state(ReplicaState(status, description, message.weight_bytes, self._containment()))
                if status is ReplicaStatus.RUNNING and not asked_first:
                    asked_first = True
                    with self._lock:
                        self._request_fork()
            elif isinstance(message, SlotMessage) and fds:
                self._add_slot(message, fds, generation)
            elif isinstance(message, Exit):
                self._slot_exited(message.pid, message.status)
            else:
                close_all(fds)
        try:
            host.wait(timeout=10)
        except subprocess.TimeoutExpired:
            host.kill()
            host.wait()
        self._host_died(host, generation)

    def _add_slot(self, message: SlotMessage, fds: list[int], generation: int) -> None:
        slot = Slot(message.pid, Channel(_socket(fds[0])), fds[1] if len(fds) > 1 else -1,
                    reusable=message.reusable, generation=generation)
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

    def _slot_exited(self, pid: int, status: int) -> None:
        with self._lock:
            slot = self._slots.pop(pid, None)
        if slot is None:
            return
        slot.exit_code = status
        groups = self._groups
        if groups is not None and not slot.reusable:
            slot.out_of_memory = groups.ran_out_of_memory(slot.pid)
        slot.exited.set()
        if groups is not None and not slot.reusable:
            threading.Thread(target=groups.remove, args=(slot.pid,), daemon=True).start()

    def _host_died(self, host: subprocess.Popen[bytes], generation: int) -> None:
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
            unhealthy_at_load = self._state.state is ReplicaStatus.UNHEALTHY
            for slot in slots:
                slot.kill_reason = slot.kill_reason or reason
                slot.exited.set()
        if (current is not None and current.job is not None and current.watch is not None
                and not current.watch.finished):
            current.watch.finished = True
            self._fail(current, f"{reason} The model's worker was restarted; you can resubmit your request.")
        if stopping or unhealthy_at_load:
            return
        self._on_incident(Incident.WORKER_RESTART)
        self._set_state(ReplicaState(ReplicaStatus.DEPLOYING, f"{reason} Restarting the worker."))
        with self._lock:
            self._restart_at = time.monotonic() + self._restart_delay
        if current is not None:
            self._on_idle()

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
                self._check_start_deadline()
                slot = self._current
                if slot is None or slot.job is None or slot.kill_reason:
                    continue
                job = slot.job
                if job.time_limit <= 0:
                    continue
                if time.monotonic() - slot.started - job.time_limit > self._kill_grace:
                    self._on_incident(Incident.TIME_LIMIT_KILL)
                    self._kill_slot(slot, (
                        f"Your request exceeded this server's time limit of "
                        f"{job.time_limit:g} seconds and did not stop when interrupted, "
                        "so its worker process was killed."
                    ))

    def _check_start_deadline(self) -> None:
        """A job process asked for and never ready (hung in its set-up) makes the replica unhealthy.

        Without this a job would wait for it for ever, QUEUED, with nothing in
        any log. What each waiting process was doing goes to the server log.
        """
        asked, limit = self._asked_at, self.policy.job_start_timeout
        if asked is None or self._stopping or self._spare is not None or time.monotonic() - asked <= limit:
            return
        if self._state.state is not ReplicaStatus.RUNNING:
            return
        self._asked_at = None
        waiting = [slot for slot in self._slots.values() if not slot.ready and slot.job is None]
        for slot in waiting:
            log.error("job process %s of %s is not ready after %.0f s: %s",
                      slot.pid, self.name, limit, process_snapshot(slot.pid))
        host = self._host
        if not waiting and host is not None:
            log.error("the worker of %s made no job process in %.0f s: %s",
                      self.name, limit, process_snapshot(host.pid))
        self._unhealthy(
            f"No job process was ready {limit:g} s after it was asked for ("
            + (f"{len(waiting)} forked, none ready" if waiting else "none was forked")
            + "; job_start_timeout). What each process was doing is in the server log."
        )

    def _containment(self, slot: Optional[Slot] = None) -> Optional[dict[str, Any]]:
        """The layers every job runs under: the host's, a job process's own, the cgroup."""
        host = self._host_containment
        if host is None:
            return None
        report = {"enabled": host.get("enabled", True), "active": list(host.get("active", [])),
                  "unavailable": dict(host.get("unavailable", {})),
                  # The host's own word on its design, one of three names: shown, never acted on.
                  "execution": str(host.get("execution", "in-process"))[:16]}
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

    def _show_containment(self, slot: Slot) -> None:
        self._set_state(ReplicaState(**{**asdict(self._state), "containment": self._containment(slot)}))

    def _unhealthy(self, description: str) -> None:
        self._set_state(ReplicaState(ReplicaStatus.UNHEALTHY, description, containment=self._containment()))

    def _set_state(self, state: ReplicaState) -> None:
        self._state = state
        self._on_state(state)


def _socket(fd: int) -> Any:
    import socket

    return socket.socket(fileno=fd)

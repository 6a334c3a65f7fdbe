"""A replica: one loaded copy of a model, and the processes that run its jobs.

`contract.Replica` is the seam the rest of nnhost programs against: ``start``,
``submit``, ``cancel``, ``stop``, ``health``, ``place``, plus a stream of events
delivered to the callbacks it was built with. `LocalReplica` implements it on this
machine with a host process (`execution.host.host`) that loads the model and never
runs user code. In fork mode the host keeps one job process forked and
contained ahead of time; `LocalReplica` hands each job to such a *slot* over
the slot's own channel, together with the job's two open files. When the job
ends the slot is killed, or parked for its owner's next job (`slots`): no
process runs a second user's job. (In trusted mode and on accelerators the
host itself is one reusable slot.)

The slots are owned by a collaborator, `slots.JobProcesses`, which is given
what it needs of its replica (`slots.ReplicaSide`: tell the host, kill it,
report). Everything a slot says is checked (`job_watch`): the replica forwards only
the events of the job it gave that slot, in order, and fails the job with a
clear ERROR, killing the slot, on anything else, on silence past the time
limit plus the grace, and when the slot dies. Its stdout and stderr arrive on
a pipe of their own and become that job's LOG lines. Each slot gets a memory
and task cgroup (`execution.os_layer.cgroups`) before its job. A host that dies fails
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
from dataclasses import asdict, replace
from typing import Any, Optional

from ..execution.channel import BadMessage, Channel, close_all
from ..execution.events import JobSpec
from ..execution.host.worker import crash_hint
from ..execution.job.process import describe_exit
from ..execution.messages import FROM_HOST, Exit, Message, Options, Place, State, Stop, Weights
from ..execution.messages import Slot as SlotMessage
from ..execution.os_layer.cgroups import JobGroups
from ..execution.policy import Design, WorkerOptions, WorkerPolicy
from .contract import OnIdle, OnIncident, OnJobEvent, OnState, ReplicaState, ReplicaStatus
from .incidents import Incident
from .process_slot import Slot
from .runtimes import RuntimeTemplates
from .slots import JobProcesses
from .spare_hosts import SPARES, clean_environment, start_host
from .stuck import process_snapshot

log = logging.getLogger("nnhost.replica")

#: Only these reach the host process's environment (it gets nothing else of the server's).
HOST_ENVIRONMENT = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME",
                    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM",
                    # The GPUs this process was given (by Ray for its actor, or by the
                    # operator): the model's cuda:N are those, not the node's first ones.
                    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


#: Seconds between two measures of the memory its other runtimes hold.
RUNTIME_MEMORY_EVERY = 5.0


def _signal_name(exitcode: Optional[int]) -> str:
    return describe_exit(exitcode)


class LocalReplica:
    """A replica backed by a host process and its job processes (`slots.JobProcesses`) on this machine."""

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
        self._kill_reason: Optional[str] = None
        self._stopping = False
        self._generation = 0
        self._restart_at: Optional[float] = None
        #: Restarts in a row whose host could not be started (each waits twice as long).
        self._failed_restarts = 0
        #: Whether the next host's first job process warms up (no job waits for it).
        self._first_warm = True
        self._groups: Optional[JobGroups] = None
        self._watchdog: Optional[threading.Thread] = None
        self.jobs = JobProcesses(name, self.policy, self._lock, self, on_job_event=on_job_event,
                                 on_idle=on_idle, on_incident=on_incident)
        #: The templates of the other nnsight versions' runtimes, started on demand.
        self.runtimes = RuntimeTemplates(name, self.policy, options, self, HOST_ENVIRONMENT)

    # -- the Replica seam ------------------------------------------------------

    @property
    def running(self) -> int:
        """How many jobs it runs now (eviction, scaling and the board ask this)."""
        return len(self.jobs.running)

    @property
    def accepting(self) -> bool:
        """Room for another job, with a job process forked and contained, waiting for it."""
        # Read without the lock, as the loop asks often: `submit` checks again under it.
        return self.jobs.spare is not None and self.jobs.has_room

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
                self.send_control(Place(device=device))

    def start(self, jobs_waiting: bool = False) -> None:
        with self._lock:
            self._stopping = False
            self._first_warm = not jobs_waiting
            process_per_job = self.policy.design(self.options.home_device) is not Design.IN_PROCESS
            # A process per job (fork or mapped design): each gets a memory group,
            # and, forked from the process that holds the weights, several can run
            # beside each other. One process for every job runs them one at a time.
            if self._groups is None and process_per_job:
                self._groups = JobGroups(self.name)
            self.jobs.capacity = max(1, self.options.jobs_at_once) if process_per_job else 1
            self.jobs.reuse = max(1, self.options.jobs_per_process) if process_per_job else 1
            self._spawn()
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name=f"watchdog-{self.name}", daemon=True)
            self._watchdog.start()

    def submit(self, spec: JobSpec, more_waiting: bool = False) -> None:
        with self._lock:
            problem = self._runtime_problem(spec.runtime)
            if problem:
                self.jobs.fail_spec(spec, problem)
                return
            if not self.jobs.has_room:
                raise RuntimeError(f"replica {self.name} runs {len(self.jobs.running)} jobs, all it may")
            if self._state.state is not ReplicaStatus.RUNNING or self.jobs.spare is None:
                raise RuntimeError(f"replica {self.name} is not ready ({self._state.state})")
            self.jobs.submit(spec, more_waiting)

    def _runtime_problem(self, runtime: str) -> Optional[str]:
        """Why this replica cannot run a job of ``runtime`` (None: it can)."""
        if not runtime:
            return None
        if runtime not in self.policy.runtimes:
            return (f"This server no longer serves nnsight {runtime} clients (its client_versions "
                    "setting changed). Install a version it serves; /status lists them.")
        if self.policy.design(self.options.home_device) is Design.IN_PROCESS:
            return (f"This model runs every job in its worker's own process (trusted mode, or an "
                    f"accelerator without execution = \"mapped\"), which has only the server's own "
                    f"nnsight: nnsight {runtime} clients cannot be served by it. Ask the operator.")
        return None

    def cancel(self, job_id: str) -> bool:
        with self._lock:
            if self.jobs.cancel_queued(job_id, "Your request was cancelled while it waited for its runtime."):
                return True
            slot = self.jobs.running_job(job_id)
            if slot is None:
                return False
            self.jobs.kill(slot, "Your request was cancelled while it was running.")
            return True

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._restart_at = None
            host = self._host
            self.send_control(Stop())
        self.runtimes.stop()
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
        try:
            control.send(Options(options=self.options))
        except OSError:
            control.close()
            host.kill()
            host.wait()
            raise
        SPARES.keep(env, environ, self.policy.spare_hosts)
        self._generation += 1
        self.jobs.asked_at = None
        self._host, self._control = host, control
        self._kill_reason = None
        self._host_containment = None
        self._set_state(ReplicaState(ReplicaStatus.DEPLOYING, "Starting the worker process."))
        threading.Thread(
            target=self._read_control, args=(control, host, self._generation),
            name=f"host-{self.name}", daemon=True,
        ).start()

    # -- what its job processes need of it (`slots.ReplicaSide`) ----------------------------

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def groups(self) -> Optional[JobGroups]:
        return self._groups

    @property
    def host_kill_reason(self) -> Optional[str]:
        return self._kill_reason

    def send_control(self, message: Message) -> None:
        if self._control is None:
            return
        try:
            self._control.send(message)
        except OSError:
            pass

    def send_to(self, runtime: str, message: Message) -> None:
        if runtime:
            self.runtimes.send(runtime, message)
        else:
            self.send_control(message)

    def retire(self, runtime: str) -> None:
        log.info("%s: the nnsight %s runtime had no job for %g s; stopping it", self.name, runtime,
                 self.policy.runtime_idle)
        # Not under the lock the caller holds: the template takes a moment to end.
        threading.Thread(target=self.runtimes.stop, args=(runtime,), daemon=True).start()

    # -- what its runtimes' templates need of it (`runtimes.RuntimeSide`) ------------------

    def runtime_slot(self, runtime: str, message: SlotMessage, fds: list[int], generation: int) -> None:
        self.jobs.add(message, fds, generation, runtime)

    def runtime_exit(self, pid: int, status: int) -> None:
        self.jobs.exited(pid, status)

    def runtime_failed(self, runtime: str, description: str) -> None:
        with self._lock:
            self.jobs.runtime_failed(runtime, description)
        self._on_idle()

    def kill_host(self, reason: Optional[str]) -> None:
        self._kill_reason = reason or self._kill_reason
        if self._host is not None and self._host.poll() is None:
            self._host.kill()

    def show_containment(self, slot: Slot) -> None:
        containment = self._containment(slot)
        if containment == self._state.containment:
            return  # every job process says the same: no news for the controller's loop
        self._set_state(ReplicaState(**{**asdict(self._state), "containment": containment}))

    def unhealthy(self, description: str) -> None:
        self._set_state(ReplicaState(ReplicaStatus.UNHEALTHY, description, containment=self._containment()))

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
                self._set_state(ReplicaState(status, description, message.weight_bytes, self._containment(),
                                             self._state.runtimes))
                if status is ReplicaStatus.RUNNING and not asked_first:
                    asked_first = True
                    with self._lock:
                        # A restarted host's first one warms up: nothing says a job waits then.
                        warm, self._first_warm = self._first_warm, True
                        self.jobs.request_fork(warm=warm)
            elif isinstance(message, SlotMessage) and fds:
                self.jobs.add(message, fds, generation)
            elif isinstance(message, Exit):
                self.jobs.exited(message.pid, message.status)
            elif isinstance(message, Weights):
                self.runtimes.weights(message, fds)  # what a runtime's template asked for
            else:
                close_all(fds)
        try:
            host.wait(timeout=10)
        except subprocess.TimeoutExpired:
            host.kill()
            host.wait()
        self._host_died(host, generation)

    def _host_died(self, host: subprocess.Popen[bytes], generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return
            reason = self._kill_reason or (
                f"The worker process stopped ({_signal_name(host.returncode)})." + crash_hint(host.returncode)
            )
            running = self.jobs.host_died(generation, reason)
            stopping = self._stopping
            unhealthy_at_load = self._state.state is ReplicaStatus.UNHEALTHY
        # Their job processes map the dead host's weights: the next host's are others.
        self.runtimes.stop()
        for slot in running:
            if slot.job is not None and slot.watch is not None and not slot.watch.finished:
                slot.watch.finished = True
                self.jobs.fail(slot, f"{reason} The model's worker was restarted; you can resubmit your request.")
        if stopping or unhealthy_at_load:
            return
        self._on_incident(Incident.WORKER_RESTART)
        self._set_state(ReplicaState(ReplicaStatus.DEPLOYING, f"{reason} Restarting the worker."))
        with self._lock:
            self._restart_at = time.monotonic() + self._restart_delay
        if running:
            self._on_idle()

    # -- time limits and restarts ---------------------------------------------------

    def _watch(self) -> None:
        """Kill a job that overran its time limit by more than the grace; restart a dead host.

        Nothing may end this loop: without it no dead host is restarted and no
        time limit holds. What goes wrong in one pass is logged, and the next
        pass runs.
        """
        measured = 0.0
        while True:
            time.sleep(0.25)
            try:
                self._watch_once()
                if time.monotonic() - measured > RUNTIME_MEMORY_EVERY:
                    measured = time.monotonic()
                    self._report_runtimes()
            except Exception:
                log.exception("the watchdog of %s", self.name)

    def _report_runtimes(self) -> None:
        """Its other runtimes and their memory, in its state when they changed (to the MiB)."""
        memory = {name: size >> 20 << 20 for name, size in self.runtimes.memory().items()} or None
        with self._lock:
            if memory != self._state.runtimes:
                self._set_state(replace(self._state, runtimes=memory))

    def _watch_once(self) -> None:
        with self._lock:
            if self._restart_at is not None and time.monotonic() >= self._restart_at:
                self._restart_at = None
                if not self._stopping:
                    self._restart()
            self._check_start_deadline()
            self.jobs.expire(time.monotonic())
            for slot in list(self.jobs.running):
                job = slot.job
                if job is None or slot.kill_reason or job.time_limit <= 0:
                    continue
                if time.monotonic() - slot.started - job.time_limit > self._kill_grace:
                    self._on_incident(Incident.TIME_LIMIT_KILL)
                    self.jobs.kill(slot, (
                        f"Your request exceeded this server's time limit of "
                        f"{job.time_limit:g} seconds and did not stop when interrupted, "
                        "so its worker process was killed."
                    ))

    def _restart(self) -> None:
        """Start the dead host's successor; if it cannot start, say why and try again later.

        The caller holds the lock.
        """
        try:
            self._spawn()
        except OSError as error:
            # The machine refused a process or a pipe (out of memory, of
            # processes, of descriptors): a later try may well succeed.
            self._failed_restarts += 1
            delay = min(60.0, self._restart_delay * 2 ** self._failed_restarts)
            why = f"The worker process could not be started again ({error}); trying again in {delay:g} s."
            log.error("%s: %s", self.name, why)
            self._set_state(ReplicaState(ReplicaStatus.DEPLOYING, why))
            self._restart_at = time.monotonic() + delay
        else:
            self._failed_restarts = 0

    def _check_start_deadline(self) -> None:
        """A job process asked for and never ready (hung in its set-up) makes the replica unhealthy.

        Without this a job would wait for it for ever, QUEUED, with nothing in
        any log. What each waiting process was doing goes to the server log.
        """
        asked, limit = self.jobs.asked_at, self.policy.job_start_timeout
        if asked is None or self._stopping or self.jobs.spare is not None or time.monotonic() - asked <= limit:
            return
        if self._state.state is not ReplicaStatus.RUNNING:
            return
        self.jobs.asked_at = None
        waiting = self.jobs.waiting()
        for slot in waiting:
            log.error("job process %s of %s is not ready after %.0f s: %s",
                      slot.pid, self.name, limit, process_snapshot(slot.pid))
        host = self._host
        if not waiting and host is not None:
            log.error("the worker of %s made no job process in %.0f s: %s",
                      self.name, limit, process_snapshot(host.pid))
        self.unhealthy(
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
        report["mode"] = ("a fresh process per job" if self.jobs.reuse <= 1
                          else f"a process per user, for up to {self.jobs.reuse} of their jobs")
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


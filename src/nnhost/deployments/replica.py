"""A replica: one loaded copy of a model that runs jobs one at a time.

`Replica` is the seam the rest of nnhost programs against: ``start``,
``submit``, ``cancel``, ``stop``, ``health``, plus a stream of events delivered
to the callback it was built with. `LocalReplica` implements it with a worker
process on this machine; a Ray actor can implement the same seam for a cluster.

`LocalReplica` also guards its worker: a job that outlives its time limit by a
grace period (user code that swallowed the interrupt, or is stuck in native
code) gets the process killed and restarted, and a worker that dies for any
reason is noticed within a second, its job failed with the reason, and a new
worker started. Callbacks run on the replica's own threads; the caller hops
them onto its event loop.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Protocol

from ..execution.events import JobEvent, JobSpec
from ..execution.handoff import discard_result, send_job
from ..execution.worker import WorkerOptions, crash_hint, serve


@dataclass
class ReplicaState:
    """What a replica reports about itself (application state, as /status names it)."""

    state: str  # NOT_STARTED, DEPLOYING, RUNNING, UNHEALTHY
    description: str = ""
    weight_bytes: Optional[int] = None
    #: Which containment layers the worker runs under (see execution.containment).
    containment: Optional[dict] = None


#: Callbacks: a job event, a state change, or "ready for the next job".
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
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class LocalReplica:
    """A replica backed by a worker process on this machine."""

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
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.RLock()
        self._process: Optional[Any] = None
        self._connection: Optional[Any] = None
        self._state = ReplicaState("NOT_STARTED", "Not started.")
        self._job: Optional[JobSpec] = None
        self._job_started = 0.0
        self._kill_reason: Optional[str] = None
        self._stopping = False
        self._generation = 0
        self._watchdog: Optional[threading.Thread] = None

    # -- the Replica seam ------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._job is not None

    def health(self) -> ReplicaState:
        return self._state

    @property
    def pid(self) -> Optional[int]:
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def place(self, device: str) -> None:
        """Move the weights (HOT on the model's device, WARM in host memory)."""
        with self._lock:
            self.options.device = device
            if self._connection is not None and self._state.state == "RUNNING":
                self._connection.send(("place", device))

    def start(self) -> None:
        with self._lock:
            self._stopping = False
            self._spawn()
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name=f"watchdog-{self.name}", daemon=True
            )
            self._watchdog.start()

    def submit(self, spec: JobSpec) -> None:
        with self._lock:
            if self._job is not None:
                raise RuntimeError(f"replica {self.name} is busy with {self._job.job_id}")
            if self._state.state != "RUNNING" or self._connection is None:
                raise RuntimeError(f"replica {self.name} is not ready ({self._state.state})")
            self._job = spec
            self._job_started = time.monotonic()
            # The job's payload and result travel as open files: a contained
            # worker cannot see the data directory (see execution.handoff).
            send_job(self._connection, spec)

    def cancel(self, job_id: str) -> bool:
        """Stop a running job by restarting the worker (the only sure interrupt)."""
        with self._lock:
            if self._job is None or self._job.job_id != job_id:
                return False
            self._kill("Your request was cancelled while it was running.")
            return True

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            process, connection = self._process, self._connection
            if connection is not None:
                try:
                    connection.send(("stop", None))
                except (OSError, EOFError, BrokenPipeError):
                    pass
        if process is not None:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        self._set_state(ReplicaState("NOT_STARTED", "Stopped."))

    # -- the worker process ------------------------------------------------------

    def _spawn(self) -> None:
        parent, child = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=serve,
            args=(child, json.dumps(asdict(self.options))),
            name=f"nnhost-worker-{self.name}",
            daemon=True,
        )
        process.start()
        child.close()
        self._generation += 1
        self._process, self._connection = process, parent
        self._kill_reason = None
        self._set_state(ReplicaState("DEPLOYING", "Starting the worker process."))
        threading.Thread(
            target=self._read,
            args=(parent, process, self._generation),
            name=f"reader-{self.name}",
            daemon=True,
        ).start()

    def _read(self, connection: Any, process: Any, generation: int) -> None:
        while True:
            try:
                kind, payload = connection.recv()
            except (EOFError, OSError):
                break
            if kind == "event":
                event = JobEvent.from_dict(payload)
                if event.status in ("COMPLETED", "ERROR"):
                    with self._lock:
                        job = self._job
                        finished = job is not None and job.job_id == event.job_id
                    if not finished:
                        continue
                    if event.status == "ERROR":
                        discard_result(job)
                self._on_job_event(event)
            elif kind == "idle":
                with self._lock:
                    if self._job is not None and self._job.job_id == payload:
                        self._job = None
                self._on_idle()
            elif kind == "state":
                self._set_state(ReplicaState(**payload))
        process.join(timeout=10)
        self._worker_died(process, generation)

    def _worker_died(self, process: Any, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return
            job, self._job = self._job, None
            reason = self._kill_reason or (
                f"The worker process stopped ({_signal_name(process.exitcode)})."
                + crash_hint(process.exitcode)
            )
            stopping = self._stopping
            unhealthy_at_load = self._state.state == "UNHEALTHY"
        if job is not None:
            discard_result(job)
            self._on_job_event(
                JobEvent(
                    job.job_id,
                    "ERROR",
                    f"{reason} The model's worker was restarted; you can resubmit "
                    "your request.",
                    meta={"runtime": round(time.monotonic() - self._job_started, 6)},
                )
            )
        if stopping:
            return
        if unhealthy_at_load:
            return  # the model cannot load; restarting would only fail again
        self._set_state(ReplicaState("DEPLOYING", f"{reason} Restarting the worker."))
        time.sleep(self._restart_delay)
        with self._lock:
            if not self._stopping and generation == self._generation:
                self._spawn()
        if job is not None:
            self._on_idle()

    def _kill(self, reason: str) -> None:
        self._kill_reason = reason
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    def _watch(self) -> None:
        """Kill a worker whose job overran its time limit by more than the grace."""
        while not self._stopping:
            time.sleep(0.25)
            with self._lock:
                job = self._job
                if job is None or job.time_limit <= 0 or self._kill_reason:
                    continue
                overrun = time.monotonic() - self._job_started - job.time_limit
                if overrun > self._kill_grace:
                    self._kill(
                        f"Your request exceeded this server's time limit of "
                        f"{job.time_limit:g} seconds and did not stop when interrupted, "
                        "so its worker process was killed."
                    )

    def _set_state(self, state: ReplicaState) -> None:
        self._state = state
        self._on_state(state)

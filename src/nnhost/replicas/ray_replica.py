"""Replicas on a Ray cluster: the controller's side of a `ray_host.ReplicaHost` actor.

`RayReplicas` is the `contract.ReplicaFactory` for ``cluster = "auto"`` or a
Ray address: it joins the cluster once, and each `RayReplica` it builds asks
Ray for an actor with the resources the model needs (a GPU per CUDA device it
spans, its size as memory), so Ray places it on a node that has them. The
actor runs the job exactly as a local replica would; this side keeps the
contract's view of it (state, busy, accepting) from the actor's reports,
collected by one thread per replica with a long poll and read with
`execution.messages.FROM_RAY_ACTOR`.

A job goes out as its spec and payload bytes, from a thread of its own (the
manager calls on the event loop, which a slow node must not hold up); its result comes back as bytes with
its COMPLETED event and is written where the job service expects it. If the
actor or its node is lost, the running job fails with an ERROR that says so,
the loss is counted as a worker restart, and a new actor is asked for: Ray
places it on a node that is still there.

`RayReplicas` also tells the manager what each alive node offers (from
``ray.nodes()``, re-read by a thread of its own every few seconds, so the
event loop never waits on the cluster) and which node each replica landed on,
so that memory is budgeted per node (`nodes.NodeRoom`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

from ..execution.channel import BadMessage
from ..execution.events import JobEvent, JobSpec
from ..execution.messages import FROM_RAY_ACTOR, RayIdle, RayIncident, RayJobEvent, State
from ..execution.policy import WorkerOptions
from ..models.adapters import read_adapter
from .contract import (
    Need,
    NodeCapacity,
    OnIdle,
    OnIncident,
    OnJobEvent,
    OnState,
    Replica,
    ReplicaState,
    ReplicaStatus,
)
from .incidents import Incident

if TYPE_CHECKING:
    from .ray_host import ReplicaHost

log = logging.getLogger("nnhost.ray")

POLL_SECONDS = 2.0
CALL_TIMEOUT = 60.0
RESTART_DELAY = 1.0
#: How often the nodes' capacities are read again.
NODES_SECONDS = 5.0


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Put back the SIGTERM and SIGINT handlers as they were before the block."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can set handlers, and so only it could lose them
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


class RayReplicas:
    """Joins the Ray cluster at ``address`` ("auto", "HOST:PORT" or "ray://HOST:PORT")."""

    def __init__(self, address: str, namespace: str = "nnhost") -> None:
        import ray

        if not ray.is_initialized():
            # ray.init installs its own SIGTERM handler (it raises SystemExit
            # wherever the process is); the server's own, which finishes the
            # running jobs and gives up the controller lease, must stay.
            with _signal_handlers_kept():
                ray.init(address=address, namespace=namespace, log_to_driver=False,
                         ignore_reinit_error=True)
        self._actor_class = ray.remote(_host_class())
        self._nodes = read_nodes()
        threading.Thread(target=self._watch_nodes, name="ray-nodes", daemon=True).start()

    def nodes(self) -> list[NodeCapacity]:
        return self._nodes

    def node_of(self, replica: Replica) -> Optional[str]:
        node = getattr(replica, "node", None) or {}
        return node.get("node_id")

    def _watch_nodes(self) -> None:
        while True:
            time.sleep(NODES_SECONDS)
            try:
                self._nodes = read_nodes()
            except Exception as error:  # keep the last view; the cluster may come back
                log.warning("could not read the Ray cluster's nodes: %s", error)

    def __call__(self, name: str, options: WorkerOptions, *, on_job_event: OnJobEvent,
                 on_state: OnState, on_idle: OnIdle, on_incident: OnIncident,
                 kill_grace: float, needs: dict[str, int]) -> "RayReplica":
        return RayReplica(name, options, self._actor_class, on_job_event=on_job_event,
                          on_state=on_state, on_idle=on_idle, on_incident=on_incident,
                          kill_grace=kill_grace, needs=needs)


def _host_class() -> type[ReplicaHost]:
    from .ray_host import ReplicaHost

    return ReplicaHost


def read_nodes() -> list[NodeCapacity]:
    """Each alive node and its resources in all, as ``ray.nodes()`` reports them."""
    import ray

    found = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        resources = node.get("Resources") or {}
        found.append(NodeCapacity(
            node_id=str(node.get("NodeID", "")), address=str(node.get("NodeManagerAddress", "")),
            memory=int(resources.get("memory", 0)), cpus=float(resources.get("CPU", 0)),
            gpus=float(resources.get("GPU", 0)),
        ))
    return found


def resources_for(needs: dict[str, int]) -> dict[str, Any]:
    """What to ask Ray for: a GPU per CUDA device one replica spans (all on one node, as
    ``device_map`` needs), and the host memory it holds; one CPU for its processes
    (`contract.Need`, which the manager budgets each node with)."""
    need = Need.of(needs)
    wanted: dict[str, Any] = {"num_cpus": need.cpus}
    if need.gpus:
        wanted["num_gpus"] = need.gpus
    if need.memory:
        wanted["memory"] = need.memory
    return wanted


# An actor class and its handles are Any here: their methods' ``.remote`` are made at
# run time, and ray's annotations type them only for methods decorated @ray.method.
class RayReplica:
    def __init__(self, name: str, options: WorkerOptions, actor_class: Any, *, on_job_event: OnJobEvent,
                 on_state: OnState, on_idle: OnIdle, on_incident: OnIncident,
                 kill_grace: float, needs: Optional[dict[str, int]] = None) -> None:
        self.name = name
        self.options = options
        self._actor_class = actor_class
        self._on_job_event, self._on_state, self._on_idle = on_job_event, on_state, on_idle
        self._on_incident = on_incident
        self._kill_grace = kill_grace
        self._needs = dict(needs or {})
        self._lock = threading.RLock()
        self._actor: Any = None
        self._generation = 0
        self._state = ReplicaState(ReplicaStatus.NOT_STARTED, "Not started.")
        self._current: Optional[JobSpec] = None
        self._remote_accepting = False
        self._stopping = False
        #: Where the actor runs, for /status and the operator.
        self.node: dict[str, Any] = {}

    # -- the Replica contract ---------------------------------------------------------------

    @property
    def running(self) -> int:
        return 0 if self._current is None else 1  # one job at a time per actor

    @property
    def accepting(self) -> bool:
        return (self._current is None and self._remote_accepting
                and self._state.state is ReplicaStatus.RUNNING)

    @property
    def pid(self) -> Optional[int]:
        return None  # the process is on a Ray node, perhaps another machine

    def health(self) -> ReplicaState:
        return self._state

    def start(self, jobs_waiting: bool = False) -> None:
        # ``jobs_waiting`` is not passed on: the node's replica warms up its first
        # job process all the same (a node's start takes far longer than that).
        with self._lock:
            self._stopping = False
            self._generation += 1
            generation = self._generation
            self.node = {}  # placed anew
            wanted = resources_for(self._needs)
            self._actor = self._actor_class.options(max_concurrency=8, **wanted).remote(
                self.name, asdict(self.options), self._kill_grace)
            self._set_state(ReplicaState(ReplicaStatus.DEPLOYING, "Asking the Ray cluster for a node."))
        threading.Thread(target=self._collect, args=(self._actor, generation),
                         name=f"ray-{self.name}", daemon=True).start()

    def submit(self, spec: JobSpec, more_waiting: bool = False) -> None:
        with self._lock:
            if not self.accepting or self._actor is None:
                raise RuntimeError(f"{self.name} is not accepting a job now")
            self._current, self._remote_accepting = spec, False
            actor = self._actor
        # Reading the payload and waiting for the node happen off the caller's thread
        # (the event loop): a slow or dying node must not hold up the server.
        threading.Thread(target=self._send, args=(actor, spec, more_waiting), name=f"ray-send-{self.name}",
                         daemon=True).start()

    def _send(self, actor: Any, spec: JobSpec, more_waiting: bool = False) -> None:
        import ray

        wire = {key: value for key, value in asdict(spec).items()
                if key not in ("payload_path", "result_path", "payload_fd", "result_fd",
                               "adapter_path", "adapter_fds")}
        try:
            payload = Path(spec.payload_path).read_bytes()
            # The node has no copy of this cache: a job's adapter travels with its payload.
            adapter = read_adapter(spec.adapter_path) if spec.adapter_path else None
            ray.get(actor.submit.remote(wire, payload, adapter, more_waiting), timeout=CALL_TIMEOUT)
        except Exception as error:
            with self._lock:
                if self._current is not spec:
                    return  # already ended (its node was lost, or it was cancelled)
                self._current = None
            log.warning("replica %s could not start job %s: %s", self.name, spec.job_id, error)
            self._on_job_event(JobEvent(
                spec.job_id, "ERROR",
                "Your request could not be started on its Ray node. You can resubmit your request.",
            ))
            self._on_idle()

    def cancel(self, job_id: str) -> bool:
        with self._lock:
            if self._current is None or self._current.job_id != job_id or self._actor is None:
                return False
            # The node reports the job's ERROR once its process is stopped.
            self._actor.cancel.remote(job_id)
            return True

    def place(self, device: str) -> None:
        with self._lock:
            self.options.device = device
            if self._actor is not None:
                self._actor.place.remote(device)

    def stop(self) -> None:
        import ray

        with self._lock:
            self._stopping = True
            actor, self._actor = self._actor, None
        if actor is not None:
            try:
                ray.get(actor.stop.remote(), timeout=CALL_TIMEOUT)
            except Exception:
                pass
            ray.kill(actor)
        self._set_state(ReplicaState(ReplicaStatus.NOT_STARTED, "Stopped."))

    # -- what the actor reports -------------------------------------------------------------

    def _collect(self, actor: Any, generation: int) -> None:
        import ray

        cursor = 0
        try:
            self.node = ray.get(actor.where.remote(), timeout=600)
        except Exception as error:
            self._lost(generation, error)
            return
        while True:
            with self._lock:
                if generation != self._generation or self._stopping:
                    return
            try:
                cursor, items = ray.get(actor.events.remote(cursor, POLL_SECONDS),
                                        timeout=POLL_SECONDS + CALL_TIMEOUT)
            except Exception as error:
                self._lost(generation, error)
                return
            for item in items:  # exactly those after the previous cursor
                self._take(item)

    def _take(self, item: object) -> None:
        try:
            message = FROM_RAY_ACTOR.parse(item)
        except BadMessage as error:
            log.warning("replica %s: its Ray actor sent %s", self.name, error)
            return
        if isinstance(message, State):
            try:
                state = ReplicaStatus(message.state)
            except ValueError:
                return
            where = (f" On Ray node {self.node.get('node_id', '?')} ({self.node.get('address', '?')})."
                     if self.node else "")
            self._set_state(ReplicaState(state, f"{message.description}{where}",
                                         message.weight_bytes, message.containment, message.runtimes))
        elif isinstance(message, RayIdle):
            self._remote_accepting = message.accepting
            self._on_idle()
        elif isinstance(message, RayIncident):
            try:
                self._on_incident(Incident(message.incident))
            except ValueError:
                pass
        elif isinstance(message, RayJobEvent):
            self._job(message)

    def _job(self, message: RayJobEvent) -> None:
        event = message.event.job_event()
        with self._lock:
            spec = self._current
        if spec is None or event.job_id != spec.job_id:
            return
        if event.status == "COMPLETED":
            result = message.result
            if result is None or len(result) != event.result_size:
                event = JobEvent(spec.job_id, "ERROR", "The result was lost on its way from the "
                                 "Ray node. You can resubmit your request.", meta=event.meta)
            else:
                Path(spec.result_path).write_bytes(result)
        if event.final:
            with self._lock:
                self._current = None
        self._on_job_event(event)

    def _lost(self, generation: int, error: BaseException) -> None:
        with self._lock:
            if generation != self._generation or self._stopping:
                return
            spec, self._current = self._current, None
            self._actor, self._remote_accepting = None, False
        log.warning("replica %s lost its Ray actor: %s", self.name, error)
        if spec is not None:
            self._on_job_event(JobEvent(
                spec.job_id, "ERROR",
                "The machine running your request was lost (its Ray node or worker stopped). "
                "You can resubmit your request.",
            ))
        self._on_incident(Incident.WORKER_RESTART)
        self._set_state(ReplicaState(ReplicaStatus.DEPLOYING,
                                     "Lost its Ray node; starting again where Ray has room."))
        time.sleep(RESTART_DELAY)
        with self._lock:
            if self._stopping or generation != self._generation:
                return
        self.start()

    def _set_state(self, state: ReplicaState) -> None:
        self._state = state
        self._on_state(state)

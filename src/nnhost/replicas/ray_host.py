"""The node side of a Ray replica: a Ray actor that runs a `LocalReplica` where Ray put it.

Ray places the actor on a node that has the resources the catalog asks for;
the actor then runs jobs exactly as a local replica does (same host process,
same containment, same job processes, same checks), on that node. It is the
controller's only contact there: a job arrives as its spec and payload bytes
(never a path of the controller's), is written to the actor's own spool
directory, and its result leaves as bytes with its COMPLETED event. Everything
the replica reports is queued as plain data (the `execution.messages` it
declares: `State`, `RayJobEvent`, `RayIdle`, `RayIncident`) that the
controller collects with a long poll (`events`) and reads with
`messages.FROM_RAY_ACTOR`, since an actor cannot call back into the
controller.

This module is imported inside Ray workers; it must not import the API, the
job service or the database.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Any, Optional

from ..execution.events import JobEvent, JobSpec
from ..execution.messages import Event, Message, RayIdle, RayIncident, RayJobEvent, State
from ..execution.policy import WorkerOptions
from ..models.adapters import write_adapter
from .contract import ReplicaState
from .incidents import Incident
from .replica import LocalReplica

#: Items kept for a controller that stopped collecting (it would be gone by then).
MAX_PENDING = 100_000


class ReplicaHost:
    def __init__(self, name: str, options: dict[str, Any], kill_grace: float) -> None:
        self._changed = threading.Condition()
        self._pending: deque[dict[str, Any]] = deque()
        self._first = 0  # sequence number of _pending[0]
        self._spool = Path(tempfile.mkdtemp(prefix="nnhost-ray-replica-"))
        self._specs: dict[str, JobSpec] = {}
        self.replica = LocalReplica(
            name, WorkerOptions(**options), on_job_event=self._job_event, on_state=self._state,
            on_idle=self._idle, on_incident=self._incident, kill_grace=kill_grace,
        )
        self.replica.start()

    # -- called by the controller -------------------------------------------------------

    def where(self) -> dict[str, str]:
        import ray

        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "address": ray.util.get_node_ip_address()}

    def submit(self, spec: dict[str, Any], payload: bytes, adapter: Optional[dict[str, bytes]] = None,
               more_waiting: bool = False) -> None:
        job_id = spec["job_id"]
        payload_path = self._spool / f"{job_id}.payload"
        payload_path.write_bytes(payload)
        adapter_path = str(write_adapter(self._spool / f"{job_id}.adapter", adapter)) if adapter else ""
        local = JobSpec(**{**spec, "payload_path": str(payload_path),
                           "result_path": str(self._spool / f"{job_id}.result"),
                           "payload_fd": -1, "result_fd": -1,
                           "adapter_path": adapter_path, "adapter_fds": []})
        self._specs[job_id] = local
        try:
            self.replica.submit(local, more_waiting)
        except Exception:
            self._forget(job_id)
            raise

    def cancel(self, job_id: str) -> bool:
        return self.replica.cancel(job_id)

    def place(self, device: str) -> None:
        self.replica.place(device)

    def stop(self) -> None:
        self.replica.stop()
        shutil.rmtree(self._spool, ignore_errors=True)

    def events(self, after: int, timeout: float) -> tuple[int, list[dict[str, Any]]]:
        """Items with sequence numbers from ``after`` on, waiting up to ``timeout`` for one."""
        with self._changed:
            self._changed.wait_for(lambda: self._first + len(self._pending) > after, timeout)
            while self._pending and self._first < after:
                self._pending.popleft()  # the controller has these
                self._first += 1
            return self._first + len(self._pending), list(self._pending)

    # -- the local replica's callbacks (its threads) ----------------------------------------

    def _push(self, item: Message) -> None:
        with self._changed:
            self._pending.append(item.model_dump())  # plain data: Ray pickles it
            while len(self._pending) > MAX_PENDING:
                self._pending.popleft()
                self._first += 1
            self._changed.notify_all()

    def _job_event(self, event: JobEvent) -> None:
        result = None
        if event.final:
            spec = self._specs.get(event.job_id)
            if event.status == "COMPLETED" and spec is not None:
                result = _read(spec.result_path)
            self._forget(event.job_id)
        self._push(RayJobEvent(event=Event.of(event), result=result))

    def _state(self, state: ReplicaState) -> None:
        self._push(State(state=state.state.value, description=state.description,
                         weight_bytes=state.weight_bytes, containment=state.containment,
                         runtimes=state.runtimes))

    def _idle(self) -> None:
        self._push(RayIdle(accepting=self.replica.accepting))

    def _incident(self, kind: Incident) -> None:
        self._push(RayIncident(incident=kind.value))

    def _forget(self, job_id: str) -> None:
        spec = self._specs.pop(job_id, None)
        if spec is not None:
            for path in (spec.payload_path, spec.result_path):
                Path(path).unlink(missing_ok=True)
            if spec.adapter_path:
                shutil.rmtree(spec.adapter_path, ignore_errors=True)


def _read(path: str) -> Optional[bytes]:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None

"""A replica with no processes, for testing the job service and the manager in-process.

`FakeFleet` is a `replicas.contract.ReplicaFactory`: the manager builds its
replicas through it exactly as through `LocalReplica`, and the test then plays
the worker's part by hand (`run`, `log`, `complete`, `fail`, `die`), with the
same events a real replica sends, through the same callbacks.

`BareReplicaSide` is the other end: the replica as its job processes
(`replicas.slots.JobProcesses`) see it, with no host behind it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from nnhost.execution.events import JobEvent, JobSpec
from nnhost.replicas.contract import ReplicaState, ReplicaStatus
from nnhost.replicas.incidents import Incident


class FakeReplica:
    def __init__(self, name, options, *, on_job_event, on_state, on_idle, on_incident, kill_grace,
                 needs):
        self.name = name
        self.options = options
        self.needs = needs
        self._on_job_event = on_job_event
        self._on_state = on_state
        self._on_idle = on_idle
        self._on_incident = on_incident
        self.state = ReplicaState(ReplicaStatus.NOT_STARTED, "Not started.")
        self.current: Optional[JobSpec] = None
        self.ran: list[str] = []
        self.cancelled: list[str] = []
        self.placed: list[str] = []
        self.stopped = False
        #: What each start() was told: whether jobs waited for it.
        self.started_with_jobs_waiting: list[bool] = []
        #: Whether start() loads at once (else the test calls ready()).
        self.instant = True
        #: Set: start() ends UNHEALTHY with this description (a model that cannot serve).
        self.broken: Optional[str] = None

    # -- the Replica contract --------------------------------------------------------

    def start(self, jobs_waiting: bool = False) -> None:
        self.started_with_jobs_waiting.append(jobs_waiting)
        self._set(ReplicaStatus.DEPLOYING, "Loading.")
        if self.broken is not None:
            self._set(ReplicaStatus.UNHEALTHY, self.broken)
        elif self.instant:
            self.ready()

    def submit(self, spec: JobSpec, more_waiting: bool = False) -> None:
        if not self.accepting:
            raise RuntimeError(f"{self.name} is not accepting")
        self.current = spec
        self.ran.append(spec.job_id)

    def cancel(self, job_id: str) -> bool:
        if self.current is None or self.current.job_id != job_id:
            return False
        self.cancelled.append(job_id)
        self.fail("Your request was cancelled.")
        return True

    def stop(self) -> None:
        self.stopped = True
        self._set(ReplicaStatus.NOT_STARTED, "Stopped.")

    def health(self) -> ReplicaState:
        return self.state

    def place(self, device: str) -> None:
        self.placed.append(device)

    @property
    def running(self) -> int:
        return 0 if self.current is None else 1

    @property
    def accepting(self) -> bool:
        return self.current is None and self.state.state is ReplicaStatus.RUNNING

    @property
    def pid(self) -> Optional[int]:
        return None

    # -- the worker's part, played by the test ---------------------------------------------

    def ready(self) -> None:
        self._set(ReplicaStatus.RUNNING, "Loaded.")

    def run(self) -> None:
        self._event("RUNNING", "Running your request.")

    def log(self, line: str) -> None:
        self._event("LOG", line)

    def complete(self, data: bytes = b"result") -> None:
        Path(self.current.result_path).write_bytes(data)
        self._finish("COMPLETED", "Your job has been completed.", result_size=len(data))

    def fail(self, description: str) -> None:
        self._finish("ERROR", description)

    def die(self) -> None:
        """The worker process dies mid-job: the job fails, the replica restarts."""
        self._on_incident(Incident.WORKER_RESTART)
        if self.current is not None:
            self._finish("ERROR", "The worker process stopped. You can resubmit your request.")
        self._set(ReplicaStatus.DEPLOYING, "Restarting the worker.")
        self.ready()

    def send(self, event: JobEvent) -> None:
        """Anything at all, as a compromised worker might send it."""
        self._on_job_event(event)

    # -- plumbing --------------------------------------------------------------------------

    def _event(self, status: str, description: str, **fields) -> None:
        self._on_job_event(JobEvent(self.current.job_id, status, description,
                                    meta={"runtime": 0.01}, **fields))

    def _finish(self, status: str, description: str, **fields) -> None:
        self._event(status, description, **fields)
        self.current = None
        self._on_idle()

    def _set(self, state: ReplicaStatus, description: str) -> None:
        self.state = ReplicaState(state, description)
        self._on_state(self.state)


class FakeFleet:
    """Builds `FakeReplica`s and remembers them, newest last, by replica name."""

    def __init__(self) -> None:
        self.made: list[FakeReplica] = []
        #: Set: every replica made from now on starts UNHEALTHY with this description.
        self.broken: Optional[str] = None

    def __call__(self, name, options, **callbacks) -> FakeReplica:
        replica = FakeReplica(name, options, **callbacks)
        replica.broken = self.broken
        self.made.append(replica)
        return replica

    def latest(self, name: str) -> FakeReplica:
        return [replica for replica in self.made if replica.name == name][-1]


class FakeCluster(FakeFleet):
    """A `FakeFleet` whose replicas land on nodes, as Ray places actors (`contract.PlacesOnNodes`).

    A replica is placed when first asked about: on the node with the most free
    memory that has room for what it reserves (`contract.Need`) beside the
    replicas placed and not stopped; it stays unplaced while none has.
    """

    def __init__(self, nodes) -> None:
        super().__init__()
        self._nodes = list(nodes)
        self.where: dict = {}

    def nodes(self):
        return list(self._nodes)

    def node_of(self, replica) -> Optional[str]:
        from nnhost.replicas.contract import Need

        if replica in self.where or replica.stopped:
            return self.where.get(replica)
        need = Need.of(replica.needs)
        free = {node.node_id: [node.memory, node.cpus, node.gpus] for node in self._nodes}
        for other, node_id in self.where.items():
            if not other.stopped and node_id in free:
                held = Need.of(other.needs)
                free[node_id] = [a - b for a, b in zip(free[node_id], (held.memory, held.cpus, held.gpus))]
        room = [(left[0], node_id) for node_id, left in free.items()
                if left[0] >= need.memory and left[1] >= need.cpus and left[2] >= need.gpus]
        if not room:
            return None
        self.where[replica] = max(room, key=lambda pair: pair[0])[1]
        return self.where[replica]


class BareReplicaSide:
    """What a replica's job processes (`replicas.slots.JobProcesses`) need of their replica,
    with no host: the control messages it would send are kept in ``sent``."""

    stopping = False
    generation = 1
    host_kill_reason = None

    def __init__(self, groups=None) -> None:
        self.groups = groups
        self.sent: list[object] = []
        #: What was sent to other runtimes' templates, as (runtime, message); those retired.
        self.sent_to: list[tuple[str, object]] = []
        self.retired: list[str] = []

    def send_control(self, message) -> None:
        self.sent.append(message)

    def send_to(self, runtime: str, message) -> None:
        if runtime:
            self.sent_to.append((runtime, message))
        else:
            self.send_control(message)

    def retire(self, runtime: str) -> None:
        self.retired.append(runtime)

    def kill_host(self, reason) -> None:
        raise AssertionError("no host to kill here")

    def unhealthy(self, description: str) -> None:
        raise AssertionError(description)

    def show_containment(self, slot) -> None:
        pass


class FakeJobProcess:
    """One fake job process of a `replicas.slots.JobProcesses`: the replica's end of its
    channel, and ours. Made, it says it is ready, so it becomes the spare."""

    def __init__(self, jobs, pid: int, runtime: str = "") -> None:
        import socket

        from nnhost.execution.channel import Channel
        from nnhost.execution.messages import Ready
        from nnhost.replicas.process_slot import Slot

        ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.slot = Slot(pid=pid, channel=Channel(ours), generation=BareReplicaSide.generation, runtime=runtime)
        jobs.slots[pid] = self.slot
        assert jobs._slot_message(self.slot, Ready(), [])

    def told(self) -> list[object]:
        """What the replica sent it so far (its descriptors closed)."""
        import os

        from nnhost.execution.channel import Channel
        from nnhost.execution.messages import TO_SPARE

        self.theirs.setblocking(False)
        heard, channel = [], Channel(self.theirs)
        try:
            while True:
                message, fds = TO_SPARE.receive(channel)
                for fd in fds:
                    os.close(fd)
                heard.append(message)
        except BlockingIOError:
            return heard

    def close(self) -> None:
        self.slot.channel.close()
        self.theirs.close()

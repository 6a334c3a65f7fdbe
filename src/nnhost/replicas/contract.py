"""What every kind of replica provides, and what the deployment manager may ask of one.

The manager programs only against `Replica` and builds replicas only through
the `ReplicaFactory` it is given, so a replica on this machine
(`replica.LocalReplica`), a fake one in the tests, or one on another machine
plug in without touching the manager or the job service. States and levels
are enums; their values are the strings ``/status`` has always reported.

A replica reports on its own threads through the callbacks it was built
with; it must never call into the manager or the job service directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Optional, Protocol, runtime_checkable

from ..execution.events import JobEvent, JobSpec
from ..execution.policy import WorkerOptions
from .incidents import Incident


class Level(StrEnum):
    """Where a deployment's weights are: on its device (HOT), in host memory (WARM), on disk."""

    HOT = "HOT"
    WARM = "WARM"
    COLD = "COLD"


class ReplicaStatus(StrEnum):
    """A replica's application state, as ``/status`` names it."""

    NOT_STARTED = "NOT_STARTED"
    DEPLOYING = "DEPLOYING"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"


@dataclass
class ReplicaState:
    """What a replica reports about itself."""

    state: ReplicaStatus
    description: str = ""
    weight_bytes: Optional[int] = None
    #: Which containment layers the processes run under (see execution.containment).
    containment: Optional[dict[str, Any]] = None
    #: The other nnsight versions' runtimes running beside it (`replicas.runtimes`), each
    #: with the memory its processes hold of their own (the weights are the host's).
    runtimes: Optional[dict[str, int]] = None


OnJobEvent = Callable[[JobEvent], None]
OnState = Callable[[ReplicaState], None]
OnIdle = Callable[[], None]
OnIncident = Callable[[Incident], None]


class Replica(Protocol):
    #: The name ``/status`` lists it under (the model's, with ``#n`` when there are several).
    name: str

    def start(self, jobs_waiting: bool = False) -> None:
        """Load the model and get ready for jobs.

        ``jobs_waiting``: jobs already wait for it (a cold start by a request):
        its first job process then goes without a warm-up, which that job
        would otherwise wait for.
        """

    def submit(self, spec: JobSpec, more_waiting: bool = False) -> None:
        """Run one job; raises RuntimeError when it cannot take it now.

        ``more_waiting``: other jobs wait for this deployment (a replica may then
        prepare for the next one differently: no warm-up).
        """

    def cancel(self, job_id: str) -> bool:
        """Stop the job if it runs here (its ERROR follows as an event)."""

    def stop(self) -> None: ...

    def health(self) -> ReplicaState: ...

    def place(self, device: str) -> None:
        """Move the weights: to the model's device for HOT, to host memory for WARM."""

    @property
    def running(self) -> int:
        """How many jobs it runs now (0: idle, so it may be evicted or retired)."""

    @property
    def accepting(self) -> bool:
        """Free and ready to start a job at once."""

    @property
    def pid(self) -> Optional[int]:
        """The process holding the weights, where there is one on this machine."""


class ReplicaFactory(Protocol):
    def __call__(
        self,
        name: str,
        options: WorkerOptions,
        *,
        on_job_event: OnJobEvent,
        on_state: OnState,
        on_idle: OnIdle,
        on_incident: OnIncident,
        kill_grace: float,
        needs: dict[str, int],
    ) -> Replica:
        """``needs``: the bytes one replica holds on each device when HOT (where to place it)."""


@dataclass(frozen=True)
class NodeCapacity:
    """What one machine of a cluster offers replicas in all, as the cluster's scheduler reports it."""

    node_id: str
    address: str
    memory: int  # bytes of host memory replicas may reserve
    cpus: float
    gpus: float


@dataclass(frozen=True)
class Need:
    """What one replica reserves on its node: host memory, CPUs, whole GPUs."""

    memory: int = 0
    cpus: float = 1
    gpus: float = 0

    @classmethod
    def of(cls, shares: dict[str, int]) -> "Need":
        """From a replica's HOT shares: a GPU per CUDA device (all on one node), its host bytes."""
        return cls(memory=int(shares.get("cpu", 0)),
                   gpus=sum(1 for device in shares if device.startswith("cuda")))


@runtime_checkable
class PlacesOnNodes(Protocol):
    """A `ReplicaFactory` whose replicas land on the nodes of a cluster, one node each.

    The manager then keeps room per node (`nodes.NodeRoom`) instead of its own
    per-device budgets, which describe only the machine it runs on. A factory
    for this machine alone (`replica.LocalReplica`) does not have these.
    """

    def nodes(self) -> list[NodeCapacity]:
        """The alive nodes (a recent view; never blocks on the cluster)."""

    def node_of(self, replica: Replica) -> Optional[str]:
        """The node ``replica`` runs on, None while the cluster is still placing it."""

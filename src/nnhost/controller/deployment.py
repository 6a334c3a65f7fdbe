"""One model's deployment as the manager holds it: its level, its replicas, what it occupies.

A module of its own because the manager (`manager`), the placement
(`placement`) and the scaling (`scaling`) all read it, and the manager
imports the other two: the type they share lives below all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..models.catalog import ModelSpec
from ..replicas.contract import Level, Replica, ReplicaStatus
from ..replicas.incidents import Tally

HOT, WARM, COLD = Level.HOT, Level.WARM, Level.COLD
#: Whether a deployment (by name) has queued or running work (the scheduler's to say).
HasWork = Callable[[str], bool]


@dataclass
class Deployment:
    spec: ModelSpec
    replicas: list[Replica] = field(default_factory=list)
    #: The level this deployment is held at (or being brought to).
    target: Level = COLD
    last_used: float = 0.0
    #: Why it is where it is (what was evicted for it, what it waits for).
    note: str = ""
    #: Jobs each of its replicas runs at once (`models.sizing.jobs_per_replica`).
    jobs_at_once: int = 1
    #: What went wrong around its jobs since the server started (kept across restarts).
    tally: Tally = field(default_factory=Tally)
    #: Times in a row it was started again because every replica was unhealthy,
    #: with no job process ready since (the job service gives up at a bound).
    failed_starts: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def count(self) -> int:
        """Replicas it holds, or will hold once brought up (its minimum)."""
        return len(self.replicas) or self.spec.replicas

    @property
    def size(self) -> int:
        return (self.spec.size_bytes or 0) * self.count

    def shares(self, level: Optional[str] = None) -> dict[str, int]:
        """Bytes this deployment holds on each device at ``level`` (its target by default).

        HOT: each device of its ``device_map`` (or its one device) holds its share;
        WARM: all of it is in host memory; COLD: nothing.
        """
        level = level or self.target
        if level == HOT:
            return {d: size * self.count for d, size in self.spec.hot_shares().items()}
        if level == WARM:
            return {"cpu": self.size}
        return {}

    def states(self) -> list[ReplicaStatus]:
        return [replica.health().state for replica in self.replicas]

    @property
    def loading(self) -> bool:
        return self.target != COLD and any(
            s in (ReplicaStatus.NOT_STARTED, ReplicaStatus.DEPLOYING) for s in self.states()
        )

    @property
    def healthy(self) -> bool:
        return ReplicaStatus.RUNNING in self.states()

    @property
    def unhealthy(self) -> bool:
        return bool(self.replicas) and all(s is ReplicaStatus.UNHEALTHY for s in self.states())

    @property
    def running(self) -> int:
        """Jobs its replicas run now."""
        return sum(replica.running for replica in self.replicas)

    @property
    def busy(self) -> bool:
        return self.running > 0

    @property
    def ready(self) -> bool:
        return self.target == HOT and self.idle_replica() is not None

    def idle_replica(self) -> Optional[Replica]:
        for replica in self.replicas:
            if replica.health().state is ReplicaStatus.RUNNING and replica.accepting:
                return replica
        return None

    @property
    def level(self) -> Level:
        if self.target == COLD or not self.healthy:
            return COLD
        return self.target

"""Replicas per model between a minimum and a maximum, following the queue.

A catalog entry's ``replicas`` is the minimum a HOT deployment keeps and
``max_replicas`` (default: the same) the most it may grow to. When the job
service says a deployment's queue has waited long enough (``scale_up_after``)
and it has no free replica and none still loading, one more replica is
started, if its share fits beside what is already placed (the placement's
answer: this machine's device budgets, or some cluster node's room): growing
never demotes another model (only a model that must become HOT at all does
that). A replica beyond the minimum that has been idle for
``scale_down_after`` seconds is stopped, one at a time.

`Scaling` is a collaborator `manager.DeploymentManager` builds and holds: it
is given the manager's deployments, how to make and retire a replica, whether
one more fits, and whether a deployment has work, and runs on the same event
loop. It never decides which job runs, and never demotes a model.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from ..replicas.contract import Level, Replica, ReplicaStatus

if TYPE_CHECKING:
    from .deployment import Deployment, HasWork


class Scaling:
    def __init__(
        self,
        deployments: Mapping[str, Deployment],
        *,
        make_replica: Callable[[Deployment, int, Level], Replica],
        retire: Callable[[Replica], None],
        fits_another: Callable[[Deployment], bool],
        has_work: HasWork,
        scale_down_after: float = 300.0,
    ) -> None:
        #: The manager's own mapping (it adds and removes entries; it never replaces it).
        self._deployments = deployments
        self._make_replica = make_replica
        self._retire = retire
        self._fits_another = fits_another
        self._has_work = has_work
        #: Seconds an extra replica may stay idle before it is stopped.
        self.scale_down_after = scale_down_after
        #: When each replica last became free.
        self._idle_since: dict[Replica, float] = {}

    def idle(self, replica: Replica) -> None:
        """``replica`` finished its job: from now it counts as idle."""
        self._idle_since[replica] = time.monotonic()

    def busy(self, replica: Replica) -> None:
        """``replica`` was given a job."""
        self._idle_since.pop(replica, None)

    def grow(self, name: str, waiting: int) -> Optional[str]:
        """Start one more replica of ``name`` if jobs wait and it may and fits; its name, else None."""
        deployment = self._deployments[name]
        spec = deployment.spec
        if waiting <= 0 or deployment.target != Level.HOT or not deployment.healthy:
            return None
        if len(deployment.replicas) >= spec.most_replicas:
            return None
        states = deployment.states()
        if ReplicaStatus.NOT_STARTED in states or ReplicaStatus.DEPLOYING in states:
            return None  # one is on its way: let it take the queue first
        if deployment.idle_replica() is not None:
            return None
        if not self._fits_another(deployment):
            return None  # no room for one more beside what is placed
        replica = self._make_replica(deployment, len(deployment.replicas), deployment.target)
        deployment.replicas.append(replica)
        replica.start(jobs_waiting=True)
        return replica.name

    def shrink(self, now: Optional[float] = None) -> list[str]:
        """Stop replicas beyond each minimum that have been idle long enough; their names."""
        now = time.monotonic() if now is None else now
        stopped = []
        for deployment in self._deployments.values():
            extra = len(deployment.replicas) - deployment.spec.replicas
            if extra <= 0 or deployment.target != Level.HOT or self._has_work(deployment.name):
                continue
            for replica in reversed(deployment.replicas[deployment.spec.replicas:]):
                since = self._idle_since.get(replica)
                if replica.running or since is None or now - since < self.scale_down_after:
                    continue
                deployment.replicas.remove(replica)
                self._idle_since.pop(replica, None)
                self._retire(replica)
                stopped.append(replica.name)
                break  # one at a time
        return stopped

"""Replicas per model between a minimum and a maximum, following the queue.

A catalog entry's ``replicas`` is the minimum a HOT deployment keeps and
``max_replicas`` (default: the same) the most it may grow to. When the job
service says a deployment's queue has waited long enough (``scale_up_after``)
and it has no free replica and none still loading, one more replica is started, if its share fits every device's budget (on a cluster:
some node's room) beside what is already placed there: growing never demotes another model (only a model that
must become HOT at all does that). A replica beyond the minimum that has been
idle for ``scale_down_after`` seconds is stopped, one at a time.

`Scaling` is a part of `DeploymentManager` (it uses the manager's replicas,
budgets and factory) and runs on the same event loop; it never decides which
job runs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional, cast

from .contract import ReplicaStatus

if TYPE_CHECKING:
    import asyncio

    from .contract import Level, Replica
    from .manager import Deployment, DeploymentManager, HasWork, OnChange
    from .nodes import NodeRoom


class Scaling:
    #: Seconds an extra replica may stay idle before it is stopped.
    scale_down_after: float = 300.0

    # What DeploymentManager provides, declared so that the code here is checked against it.
    deployments: dict[str, Deployment]
    _idle_since: dict[Replica, float]
    _loop: asyncio.AbstractEventLoop
    _on_change: OnChange
    _has_work: HasWork
    budget: Callable[[str], Optional[int]]
    used: Callable[[str], int]
    _replica: Callable[[Deployment, int, Level], Replica]
    nodes: Optional[NodeRoom]

    def _note_idle(self, name: str, replica: Replica) -> None:
        self._idle_since[replica] = time.monotonic()
        self._on_change(name)

    def _note_busy(self, replica: Replica) -> None:
        self._idle_since.pop(replica, None)

    def grow(self, name: str, waiting: int) -> Optional[str]:
        """Start one more replica of ``name`` if jobs wait and it may and fits; its name, else None."""
        deployment = self.deployments[name]
        spec = deployment.spec
        if waiting <= 0 or deployment.target != "HOT" or not deployment.healthy:
            return None
        if len(deployment.replicas) >= spec.most_replicas:
            return None
        states = deployment.states()
        if ReplicaStatus.NOT_STARTED in states or ReplicaStatus.DEPLOYING in states:
            return None  # one is on its way: let it take the queue first
        if deployment.idle_replica() is not None:
            return None
        # Scaling is only ever a part of DeploymentManager (see its class declarations).
        manager = cast("DeploymentManager", self)
        if self.nodes is not None and not self.nodes.fits(manager, deployment, extra=True):
            return None  # no node has room for one more beside what is placed
        for device, share in spec.hot_shares().items():
            budget = self.budget(device)
            if budget is not None and self.used(device) + share > budget:
                return None
        replica = self._replica(deployment, len(deployment.replicas), deployment.target)
        deployment.replicas.append(replica)
        replica.start()
        return replica.name

    def shrink(self, now: Optional[float] = None) -> list[str]:
        """Stop replicas beyond each minimum that have been idle long enough; their names."""
        now = time.monotonic() if now is None else now
        stopped = []
        for deployment in self.deployments.values():
            extra = len(deployment.replicas) - deployment.spec.replicas
            if extra <= 0 or deployment.target != "HOT" or self._has_work(deployment.name):
                continue
            for replica in reversed(deployment.replicas[deployment.spec.replicas:]):
                since = self._idle_since.get(replica)
                if replica.busy or since is None or now - since < self.scale_down_after:
                    continue
                deployment.replicas.remove(replica)
                self._idle_since.pop(replica, None)
                self._loop.run_in_executor(None, replica.stop)
                stopped.append(replica.name)
                break  # one at a time
        return stopped

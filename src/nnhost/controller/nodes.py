"""Room for replicas node by node, when the replica factory places them on a cluster's nodes.

A replica lands on ONE node (a Ray actor is placed whole), so "does it fit"
is a question about a node, never about the cluster's sum: a model whose
replica needs more than every node has can never run (`CannotFit`, naming the
largest node), however much the nodes have together. What a replica holds on
its node is what it asked the cluster for (`Need`, the same figures
`ray_replica.resources_for` asks with), at WARM as at HOT, since the
reservation lasts as long as the replica: so making room demotes idle
deployments to COLD, on the node where that frees enough with the fewest
demotions. Capacities are what the factory reports (`contract.PlacesOnNodes`);
a replica the cluster is still placing is counted on the node with the most
free memory that can take it, as the cluster would place it.

`NodeRoom` is the `placement.Placement` the composition root gives
`manager.DeploymentManager` for such a factory, used on its event loop. It
never asks the cluster anything itself (the factory's view is read, not
refreshed) and never starts or stops a replica except through the manager's
`set_level`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

from ..replicas.contract import Level, Need, NodeCapacity, PlacesOnNodes
from ..units import format_size
from .placement import CannotFit, Holdings

if TYPE_CHECKING:
    from .deployment import Deployment
    from .manager import DeploymentManager


class _Free:
    def __init__(self, node: NodeCapacity) -> None:
        self.node = node
        self.memory, self.cpus, self.gpus = node.memory, node.cpus, node.gpus

    def takes(self, need: Need) -> bool:
        return need.memory <= self.memory and need.cpus <= self.cpus and need.gpus <= self.gpus

    def take(self, need: Need) -> None:
        self.memory -= need.memory
        self.cpus -= need.cpus
        self.gpus -= need.gpus


class NodeRoom:
    def __init__(self, factory: PlacesOnNodes) -> None:
        self.factory = factory

    @staticmethod
    def need(deployment: "Deployment") -> Need:
        return Need.of(deployment.spec.hot_shares())

    # -- what is free where ------------------------------------------------------------

    def _free(self, held: Holdings, excluding: Iterable["Deployment"] = ()) -> dict[str, _Free]:
        free = {node.node_id: _Free(node) for node in self.factory.nodes()}
        skip = list(excluding)
        pending = []
        for deployment in held.deployments.values():
            if deployment.target == Level.COLD or any(deployment is d for d in skip):
                continue
            need = self.need(deployment)
            for replica in deployment.replicas:
                node = free.get(self.factory.node_of(replica) or "")
                if node is None:
                    pending.append(need)  # still being placed (or its node is gone)
                else:
                    node.take(need)
        _place(free, pending)
        return free

    def fits(self, held: Holdings, wanted: "Deployment", extra: bool = False,
             excluding: Iterable["Deployment"] = ()) -> bool:
        """Whether ``wanted``'s replicas (or, with ``extra``, one more beside them) fit now."""
        if extra:
            return not _place(self._free(held, excluding), [self.need(wanted)])
        free = self._free(held, [wanted, *excluding])
        return not _place(free, [self.need(wanted)] * wanted.count)

    def check(self, wanted: "Deployment") -> None:
        """Raise `CannotFit` when no node could hold one replica even with nothing else on it."""
        nodes = self.factory.nodes()
        need = self.need(wanted)
        if not nodes or any(_Free(node).takes(need) for node in nodes):
            return  # none yet (the cluster may still be starting) or one would do
        # The nearest miss: a node with the CPUs and GPUs if there is one, then by memory.
        largest = max(nodes, key=lambda node: (node.cpus >= need.cpus and node.gpus >= need.gpus,
                                               node.memory, node.gpus, node.cpus))
        wants = [f"{format_size(need.memory)} of memory"] if need.memory else []
        wants += [f"{need.gpus:g} GPUs"] if need.gpus else []
        wants += ["a CPU" if need.cpus == 1 else f"{need.cpus:g} CPUs"]
        raise CannotFit(
            f"{wanted.name} needs {' and '.join(wants)} on one Ray node (a replica runs on one node), "
            f"and no node has that: the largest, {largest.address} ({largest.node_id[:12]}), has "
            f"{format_size(largest.memory)} of memory, {largest.gpus:g} GPUs and "
            f"{largest.cpus:g} CPUs. Ask the operator for a larger node or a smaller model."
        )

    # -- making room ---------------------------------------------------------------------

    def make_room(self, held: Holdings, wanted: "Deployment", level: Level) -> Optional[str]:
        """Demote idle deployments to COLD until ``wanted`` fits; None if it cannot yet.

        Returns a note of what was evicted (possibly empty). ``level`` changes nothing:
        a replica reserves the same on its node at WARM as at HOT.
        """
        self.check(wanted)
        evicted = []
        while not self.fits(held, wanted):
            victims = self._cheapest(held, wanted)
            if not victims:
                return None
            for victim in victims:
                held.set_level(victim.name, Level.COLD, note=f"Demoted to make room for {wanted.name}.")
                evicted.append(f"{victim.name} (now COLD)")
        return f"evicted {', '.join(evicted)}" if evicted else ""

    def _cheapest(self, held: Holdings, wanted: "Deployment") -> list["Deployment"]:
        """The fewest idle deployments, least recently used first, on one node, whose demotion
        lets ``wanted`` fit; empty when no such set exists."""
        idle = held.victims(None, wanted)
        best: list["Deployment"] = []
        for node_id in (node.node_id for node in self.factory.nodes()):
            here = [d for d in idle if any(self.factory.node_of(r) == node_id for r in d.replicas)]
            for count in range(1, len(here) + 1):
                if best and count >= len(best):
                    break
                if self.fits(held, wanted, excluding=here[:count]):
                    best = here[:count]
                    break
        return best

    def short_of(self, held: Holdings, wanted: "Deployment", level: Level) -> Optional[str]:
        """None when ``wanted``'s replicas fit on the nodes now, else what is full."""
        self.check(wanted)  # raises CannotFit when no node ever could
        return None if self.fits(held, wanted) else "every Ray node's"

    def fits_another(self, held: Holdings, wanted: "Deployment") -> bool:
        return self.fits(held, wanted, extra=True)

    def waiting_note(self, held: Holdings, wanted: "Deployment", level: Level) -> str:
        need = self.need(wanted)
        free = self._free(held, [wanted]).values()
        most = max((node.memory for node in free), default=0)
        return (f"waiting for room on a Ray node: a replica needs {format_size(need.memory)} of "
                f"memory and {need.gpus:g} GPUs; the most free on any node is {format_size(most)}, "
                "the rest is held by deployments with work in progress")

    # -- reporting -----------------------------------------------------------------------

    def status(self, held: Holdings) -> dict[str, dict[str, Any]]:
        """``/status``'s ``nodes``: each alive node, what it offers and what replicas hold there."""
        free = self._free(held)
        out: dict[str, dict[str, Any]] = {}
        for node_id, room in free.items():
            node = room.node
            names = [replica.name for d in held.deployments.values() if d.target != Level.COLD
                     for replica in d.replicas if self.factory.node_of(replica) == node_id]
            out[node_id] = {
                "address": node.address,
                "budget_bytes": node.memory,
                "used_bytes": node.memory - room.memory,
                "cpus": node.cpus, "cpus_used": node.cpus - room.cpus,
                "gpus": node.gpus, "gpus_used": node.gpus - room.gpus,
                "replicas": names,
            }
        return out

    def report(self, held: Holdings) -> dict[str, Any]:
        return {"devices": self.devices(held), "nodes": self.status(held)}

    def devices(self, held: Holdings) -> dict[str, dict[str, int]]:
        """``/status``'s ``devices`` on a cluster: host memory over all nodes (each node's is in ``nodes``)."""
        nodes = self.status(held).values()
        return {"cpu": {"budget_bytes": sum(n["budget_bytes"] for n in nodes),
                        "used_bytes": sum(n["used_bytes"] for n in nodes)}}


def _place(free: dict[str, _Free], needs: list[Need]) -> list[Need]:
    """Put each need on the node with the most free memory that takes it; those that fit nowhere."""
    left = []
    for need in needs:
        nodes = [node for node in free.values() if node.takes(need)]
        if not nodes:
            left.append(need)
            continue
        max(nodes, key=lambda node: (node.memory, node.gpus, node.cpus)).take(need)
    return left


def memory_report(manager: "DeploymentManager") -> dict[str, Any]:
    """``/status``'s memory keys: ``devices`` (this machine's budgets; on a cluster, the nodes'
    sum) and, on a cluster only, ``nodes``, each node's own (the placement's report)."""
    return manager.placement.report(manager)

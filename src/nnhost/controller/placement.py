"""Where a model's replicas may go, and whom to demote for room: the placement strategy.

Why it exists: whether a model fits, and which idle deployments to demote so
that it does, depends on where replicas land. On this machine each device has
a memory budget (`DeviceBudgets`); when the replica factory places replicas
on a cluster's nodes, room is kept per node instead (`nodes.NodeRoom`), and
this machine's budgets play no part. The composition root picks one
(`loop.placement_for`) and gives it to `manager.DeploymentManager`, which asks it
the same questions either way and never asks which one it holds.

A placement is called on the controller's event loop. It reads the manager's
deployments through `Holdings` and changes nothing but through its
`set_level` (a demotion). It never demotes a deployment with work (the
manager's `victims` leaves those out), never starts a replica, and never
decides which job runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Protocol

from ..replicas.contract import Level
from ..units import format_size

if TYPE_CHECKING:
    from .deployment import Deployment


class CannotFit(RuntimeError):
    """The model can never fit: larger than its device's whole budget, or than every node."""


class Holdings(Protocol):
    """What a placement reads of the deployment manager, and the one change it may ask for."""

    @property
    def deployments(self) -> dict[str, Deployment]:
        """Every deployment, by name."""

    def used(self, device: str, excluding: Optional[Deployment] = None) -> int:
        """Bytes the deployments (but ``excluding``) hold on ``device`` at their targets."""

    def victims(self, device: Optional[str], wanted: Deployment) -> list[Deployment]:
        """Deployments that may be demoted for ``wanted`` (on ``device``; None: anywhere),
        least recently used first; never one with work."""

    def set_level(self, name: str, level: Level, note: str = "") -> None:
        """Move a deployment to ``level`` now."""


class Placement(Protocol):
    def short_of(self, held: Holdings, wanted: Deployment, level: Level) -> Optional[str]:
        """Where ``wanted`` does not fit at ``level`` beside what is placed ("cuda:0"), or
        None if it fits; raises `CannotFit` when it never could."""

    def make_room(self, held: Holdings, wanted: Deployment, level: Level) -> Optional[str]:
        """Demote idle deployments until ``wanted`` fits at ``level``; None if it cannot yet.
        Returns a note of what was evicted (possibly empty); raises `CannotFit`."""

    def waiting_note(self, held: Holdings, wanted: Deployment, level: Level) -> str:
        """Why ``wanted`` waits, for its users, when `make_room` could not make room."""

    def fits_another(self, held: Holdings, wanted: Deployment) -> bool:
        """Whether one more replica of HOT ``wanted`` fits beside what is placed (never demoting)."""

    def report(self, held: Holdings) -> dict[str, Any]:
        """``/status``'s memory keys: ``devices`` and, on a cluster, ``nodes``."""


class DeviceBudgets:
    """This machine's devices, each with a memory budget (a device without one is unbounded)."""

    def __init__(self, budgets: dict[str, int]) -> None:
        self.budgets = dict(budgets)

    def budget(self, device: str) -> Optional[int]:
        return self.budgets.get(device)

    def _fits(self, held: Holdings, device: str, size: int, excluding: Deployment) -> bool:
        budget = self.budget(device)
        return budget is None or held.used(device, excluding) + size <= budget

    def short_of(self, held: Holdings, wanted: Deployment, level: Level) -> Optional[str]:
        for device, size in wanted.shares(level).items():
            if not self._fits(held, device, size, wanted):
                return device
        return None

    def make_room(self, held: Holdings, wanted: Deployment, level: Level) -> Optional[str]:
        """Demote idle deployments on each device ``wanted`` spans, least recently used first:
        to WARM when the device is not the host and the host has room, else to COLD."""
        needs = wanted.shares(level)
        for device, size in needs.items():
            budget = self.budget(device)
            if budget is not None and size > budget:
                raise CannotFit(
                    f"{wanted.name} needs {format_size(size)} on {device}, more than its whole "
                    f"budget of {format_size(budget)}. Ask the operator to raise memory_budget."
                )
        evicted = []
        for device, size in needs.items():
            while not self._fits(held, device, size, wanted):
                victims = held.victims(device, wanted)
                if not victims:
                    return None
                victim = victims[0]
                to = Level.WARM if (victim.target == Level.HOT and device != "cpu"
                                    and self._fits(held, "cpu", victim.size, victim)) else Level.COLD
                held.set_level(victim.name, to, note=f"Demoted to make room for {wanted.name}.")
                evicted.append(f"{victim.name} (now {to})")
        return f"evicted {', '.join(evicted)}" if evicted else ""

    def waiting_note(self, held: Holdings, wanted: Deployment, level: Level) -> str:
        device = self.short_of(held, wanted, level) or "cpu"
        budget = self.budget(device) or 0
        return (
            f"waiting for memory on {device}: {format_size(held.used(device, wanted))} of "
            f"{format_size(budget)} is held by deployments with work in progress"
        )

    def fits_another(self, held: Holdings, wanted: Deployment) -> bool:
        for device, share in wanted.spec.hot_shares().items():
            budget = self.budget(device)
            if budget is not None and held.used(device) + share > budget:
                return False
        return True

    def report(self, held: Holdings) -> dict[str, Any]:
        return {"devices": {device: {"budget_bytes": budget, "used_bytes": held.used(device)}
                            for device, budget in self.budgets.items()}}


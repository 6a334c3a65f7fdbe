"""Job processes that wait for their owner's next job: which, for whom, and until when.

A job's process that ran one user's job may run that user's next ones
(`slots.JobProcesses`, ``jobs_per_process``): a user's loop of small traces
then pays for a fork, a containment set-up and an exit once, not per
request. After its job's result it *settles* (puts the model back, says it
is ready again), then is *parked*: stopped by its parent
(`execution.host.parked`), so nothing its job left behind runs, until a job of
the same owner takes it. It is killed after `PARKED_SECONDS` unused, when
`PARKED_PER_REPLICA` others are parked, if it is not ready again within
`SETTLE_SECONDS` of its result, or if it keeps more than `PARKED_BYTES` of
memory of its own.

`Parking` is bookkeeping only, under the replica's lock (its caller's): it
says which processes to hand a job or to end, and never talks to a process
or its host itself. It must never hand one user's process to another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .process_slot import Slot

#: A parked job's process unused this long is killed (seconds).
PARKED_SECONDS = 60.0
#: At most this many job processes of one replica wait for their owner's next job.
PARKED_PER_REPLICA = 32
#: A process told it may stay must be ready again this soon after its result (seconds).
SETTLE_SECONDS = 2.0
#: A process that keeps more memory of its own than this after its job is not kept.
PARKED_BYTES = 256 << 20


class Parking:
    """The processes of one replica that settle after a job, and those parked, oldest first."""

    def __init__(self) -> None:
        self.settling: list[Slot] = []
        self.parked: list[Slot] = []

    def settle(self, slot: Slot, now: float) -> None:
        """``slot``'s job ended and it may stay: it has until ``now`` + `SETTLE_SECONDS` to be ready."""
        slot.since = now
        self.settling.append(slot)

    def settled(self, slot: Slot) -> bool:
        """``slot`` said it is ready again: whether it was still settling (it stops)."""
        if slot in self.settling:
            self.settling.remove(slot)
            return True
        return False

    def park(self, slot: Slot, now: float) -> list[Slot]:
        """``slot`` (settled) waits for its owner; returns those it pushes out, to be ended."""
        slot.since = now
        self.parked.append(slot)
        pushed_out = self.parked[:-PARKED_PER_REPLICA] if len(self.parked) > PARKED_PER_REPLICA else []
        del self.parked[:len(pushed_out)]
        return pushed_out

    def take(self, owner: str, runtime: str = "") -> Optional[Slot]:
        """The parked process of ``owner`` in ``runtime``, the most recently used, if any; it leaves the lot."""
        if not owner:
            return None
        for slot in reversed(self.parked):
            if slot.owner == owner and slot.runtime == runtime:
                self.parked.remove(slot)
                return slot
        return None

    def expired(self, now: float) -> list[Slot]:
        """Those that waited too long (parked unused, or not ready again after a job); they leave the lot."""
        late = [s for s in self.parked if now - s.since > PARKED_SECONDS]
        late += [s for s in self.settling if now - s.since > SETTLE_SECONDS]
        for slot in late:
            self.forget(slot)
        return late

    def forget(self, slot: Slot) -> bool:
        """``slot`` leaves the lot (it died, or settled); whether it was in it."""
        for waiting in (self.settling, self.parked):
            if slot in waiting:
                waiting.remove(slot)
                return True
        return False

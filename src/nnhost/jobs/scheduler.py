"""Which waiting job runs next on a deployment.

One queue per deployment; inside it, one FIFO per user, served round-robin, so
a user who submits a hundred jobs delays another user's first job by at most
one job per other user rather than by a hundred. The queue can say where a
job stands, which is what a QUEUED description shows.

It holds job ids only; it never touches the database or a replica.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Hashable, Optional


class FairQueue:
    """Round-robin across users, FIFO within a user."""

    def __init__(self) -> None:
        self._users: "OrderedDict[Hashable, deque[str]]" = OrderedDict()

    def __len__(self) -> int:
        return sum(len(jobs) for jobs in self._users.values())

    def push(self, user: Hashable, job_id: str) -> None:
        self._users.setdefault(user, deque()).append(job_id)

    def pop(self) -> Optional[str]:
        if not self._users:
            return None
        user, jobs = next(iter(self._users.items()))
        job_id = jobs.popleft()
        if jobs:
            self._users.move_to_end(user)
        else:
            del self._users[user]
        return job_id

    def remove(self, job_id: str) -> bool:
        for user, jobs in list(self._users.items()):
            if job_id in jobs:
                jobs.remove(job_id)
                if not jobs:
                    del self._users[user]
                return True
        return False

    def order(self) -> list[str]:
        """Every waiting job, in the order `pop` would hand them out."""
        lanes = [list(jobs) for jobs in self._users.values()]
        ordered: list[str] = []
        depth = 0
        while True:
            row = [lane[depth] for lane in lanes if depth < len(lane)]
            if not row:
                return ordered
            ordered.extend(row)
            depth += 1


class Scheduler:
    """The queues of all deployments."""

    def __init__(self) -> None:
        self._queues: dict[str, FairQueue] = {}

    def queue(self, deployment: str) -> FairQueue:
        return self._queues.setdefault(deployment, FairQueue())

    def enqueue(self, deployment: str, user: Hashable, job_id: str) -> None:
        self.queue(deployment).push(user, job_id)

    def next(self, deployment: str) -> Optional[str]:
        return self.queue(deployment).pop()

    def remove(self, deployment: str, job_id: str) -> bool:
        return self.queue(deployment).remove(job_id)

    def positions(self, deployment: str) -> dict[str, int]:
        """1-based position of each waiting job (1 runs next)."""
        return {job_id: i + 1 for i, job_id in enumerate(self.queue(deployment).order())}

    def waiting(self, deployment: str) -> int:
        return len(self.queue(deployment))

"""Which waiting job runs next on a deployment: fair queueing by execution time used.

Each deployment has one queue; inside it each user has a FIFO lane. The next
job comes from the user who has used the least execution time (a virtual
clock per user, charged an estimate when a job is dispatched and corrected by
its real runtime when it ends, as the server measured it: from dispatch to the
final event, never a figure the job reported about itself), so a user with two hundred queued jobs and a
user with five take turns, and a user whose jobs are long gets fewer turns than
one whose jobs are short. A user who was idle re-enters at the current clock,
never behind it, so idleness cannot be banked into a burst later. Users tagged
``priority`` form a class served ahead of everyone else, fairly among
themselves.

The queue can replay its own decisions without making them (`order`), which is
how a QUEUED job learns its position and an estimated wait. It holds job ids
only; it never touches the database or a replica.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional

#: Seconds charged for a job before anything has been measured.
DEFAULT_COST = 1.0
#: How a lane's head job ranks (lowest first): priority class, then the user's clock, then arrival.
_Rank = tuple[bool, float, int]


@dataclass
class _Lane:
    jobs: "deque[str]" = field(default_factory=deque)
    priority: bool = False


class FairQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._now = clock
        self._lanes: dict[Hashable, _Lane] = {}
        self._vtime: dict[Hashable, float] = {}
        self._clock = 0.0
        self._arrival: dict[str, int] = {}
        #: When each waiting job joined the queue (monotonic seconds), for `oldest_wait`.
        self._since: dict[str, float] = {}
        self._counter = 0
        #: Each running job: its user, what it was charged, when it was dispatched.
        self._charged: dict[str, tuple[Hashable, float, float]] = {}
        #: Moving average of job runtimes here, used as the charge at dispatch.
        self.mean_runtime = DEFAULT_COST

    def __len__(self) -> int:
        return sum(len(lane.jobs) for lane in self._lanes.values())

    def push(self, user: Hashable, job_id: str, priority: bool = False) -> None:
        lane = self._lanes.get(user)
        if lane is None:
            lane = self._lanes[user] = _Lane(priority=priority)
            self._vtime[user] = max(self._vtime.get(user, 0.0), self._clock)
        lane.priority = lane.priority or priority
        lane.jobs.append(job_id)
        self._counter += 1
        self._arrival[job_id] = self._counter
        self._since[job_id] = self._now()

    def oldest_wait(self, now: Optional[float] = None) -> float:
        """Seconds the longest-waiting job has been in this queue (0 when it is empty)."""
        if not self._since:
            return 0.0
        now = self._now() if now is None else now
        return max(0.0, now - min(self._since.values()))

    def _rank(self, user: Hashable, vtime: float, head: str) -> _Rank:
        return (not self._lanes[user].priority, vtime, self._arrival[head])

    def _pick(self) -> Optional[Hashable]:
        best, best_key = None, None
        for user, lane in self._lanes.items():
            key = self._rank(user, self._vtime[user], lane.jobs[0])
            if best_key is None or key < best_key:
                best, best_key = user, key
        return best

    def pop(self) -> Optional[str]:
        user = self._pick()
        if user is None:
            return None
        lane = self._lanes[user]
        job_id = lane.jobs.popleft()
        self._arrival.pop(job_id, None)
        self._since.pop(job_id, None)
        self._clock = max(self._clock, self._vtime[user])
        cost = self.mean_runtime
        self._vtime[user] += cost
        self._charged[job_id] = (user, cost, self._now())
        if not lane.jobs:
            del self._lanes[user]
        return job_id

    def finished(self, job_id: str, ran: bool = True) -> None:
        """Correct the user's charge for ``job_id`` by the time it held its replica.

        ``ran`` is False for a job that ended without running (cancelled, lost
        with its replica): its estimate stands.
        """
        user, charged, dispatched = self._charged.pop(job_id, (None, 0.0, 0.0))
        if user is None or not ran:
            return
        runtime = max(0.0, self._now() - dispatched)
        self._vtime[user] = self._vtime.get(user, 0.0) + runtime - charged
        self.mean_runtime = 0.8 * self.mean_runtime + 0.2 * max(runtime, 1e-3)

    def remove(self, job_id: str) -> bool:
        for user, lane in list(self._lanes.items()):
            if job_id in lane.jobs:
                lane.jobs.remove(job_id)
                self._arrival.pop(job_id, None)
                self._since.pop(job_id, None)
                if not lane.jobs:
                    del self._lanes[user]
                return True
        return False

    def order(self, limit: int = 10_000) -> list[str]:
        """Waiting jobs in the order `pop` would hand them out (up to ``limit``)."""
        heap: list[tuple[_Rank, float, int, Hashable]] = []
        for user, lane in self._lanes.items():
            vtime = self._vtime[user]
            heapq.heappush(heap, (self._rank(user, vtime, lane.jobs[0]), vtime, 0, user))
        ordered: list[str] = []
        while heap and len(ordered) < limit:
            _, vtime, index, user = heapq.heappop(heap)
            jobs = self._lanes[user].jobs
            ordered.append(jobs[index])
            if index + 1 < len(jobs):
                vtime += self.mean_runtime
                rank = self._rank(user, vtime, jobs[index + 1])
                heapq.heappush(heap, (rank, vtime, index + 1, user))
        return ordered


class Scheduler:
    """The queues of all deployments."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._queues: dict[str, FairQueue] = {}
        self._clock = clock

    def queue(self, deployment: str) -> FairQueue:
        queue = self._queues.get(deployment)
        if queue is None:
            queue = self._queues[deployment] = FairQueue(self._clock)
        return queue

    def enqueue(self, deployment: str, user: Hashable, job_id: str, priority: bool = False) -> None:
        self.queue(deployment).push(user, job_id, priority)

    def next(self, deployment: str) -> Optional[str]:
        return self.queue(deployment).pop()

    def finished(self, deployment: str, job_id: str, ran: bool = True) -> None:
        self.queue(deployment).finished(job_id, ran)

    def remove(self, deployment: str, job_id: str) -> bool:
        return self.queue(deployment).remove(job_id)

    def positions(self, deployment: str) -> dict[str, int]:
        """1-based position of each waiting job (1 runs next)."""
        return {job_id: i + 1 for i, job_id in enumerate(self.queue(deployment).order())}

    def waiting(self, deployment: str) -> int:
        return len(self.queue(deployment))

    def has_work(self, deployment: str) -> bool:
        """Whether jobs wait for ``deployment`` (then it must not be demoted or shrunk)."""
        return self.waiting(deployment) > 0

    def mean_runtime(self, deployment: str) -> float:
        return self.queue(deployment).mean_runtime

    def oldest_wait(self, deployment: str, now: Optional[float] = None) -> float:
        return self.queue(deployment).oldest_wait(now)

"""The last hour of finished jobs, for the status page: medians and jobs per minute.

Fed by `metrics.JobMetrics` with each job's wait and run time as it ends; kept
in memory and pruned to the window, so it costs a few floats per job and
describes this process (a restart starts an empty chart, as the counters do).
It holds no ids, users or descriptions: only what the public page shows.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

WINDOW = 3600.0


@dataclass(frozen=True)
class Ended:
    at: float
    model: str
    completed: bool
    wait: Optional[float]
    run: Optional[float]


class RecentJobs:
    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._ended: deque[Ended] = deque()

    def add(self, model: str, completed: bool, wait: Optional[float], run: Optional[float],
            at: Optional[float] = None) -> None:
        self._ended.append(Ended(time.time() if at is None else at, model, completed, wait, run))
        self._prune(time.time())

    def _prune(self, now: float) -> None:
        while self._ended and self._ended[0].at < now - self.window:
            self._ended.popleft()

    def summary(self, model: str, now: Optional[float] = None) -> dict[str, Any]:
        """Median wait and run time (seconds) and counts of ``model``'s jobs in the window."""
        now = time.time() if now is None else now
        self._prune(now)
        mine = [e for e in self._ended if e.model == model]
        waits = [e.wait for e in mine if e.wait is not None]
        runs = [e.run for e in mine if e.run is not None]
        return {
            "median_wait_seconds": statistics.median(waits) if waits else None,
            "median_run_seconds": statistics.median(runs) if runs else None,
            "completed": sum(1 for e in mine if e.completed),
            "errors": sum(1 for e in mine if not e.completed),
        }

    def per_minute(self, minutes: int = 60, now: Optional[float] = None) -> list[dict[str, int]]:
        """Jobs that ended in each of the last ``minutes`` minutes, oldest first."""
        now = time.time() if now is None else now
        self._prune(now)
        buckets = [{"completed": 0, "errors": 0} for _ in range(minutes)]
        for ended in self._ended:
            age = int((now - ended.at) // 60)
            if 0 <= age < minutes:
                buckets[minutes - 1 - age]["completed" if ended.completed else "errors"] += 1
        return buckets

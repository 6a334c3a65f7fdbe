"""What went wrong around jobs, counted per deployment for the operator.

A replica notes each incident as it sees it (on its own threads, hence the
lock); the deployment keeps the tally across replica restarts and evictions,
so the numbers describe this server process since it started. Only what the
server itself observed is counted (a process that died, a kill it ordered, a
message it refused), never what a worker claims about itself. It knows nothing
of how the numbers are exported.
"""

from __future__ import annotations

import threading
from enum import Enum


class Incident(str, Enum):
    #: The model's host process died and was started again.
    WORKER_RESTART = "worker_restart"
    #: A job process sent something the protocol forbids and was killed.
    PROTOCOL_VIOLATION = "protocol_violation"
    #: A job ran out of its memory limit and was killed.
    OUT_OF_MEMORY = "out_of_memory"
    #: A job overran its time limit, ignored the interrupt, and was killed.
    TIME_LIMIT_KILL = "time_limit_kill"
    #: A job's process ended before reporting a result, for any other reason.
    JOB_PROCESS_DIED = "job_process_died"


class Tally:
    """Thread-safe counts of incidents, every kind present from the start (at 0)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {kind: 0 for kind in Incident}

    def note(self, kind: Incident) -> None:
        with self._lock:
            self._counts[kind] += 1

    def counts(self) -> dict[Incident, int]:
        with self._lock:
            return dict(self._counts)

"""A job and the rules of its lifecycle.

A job moves RECEIVED -> QUEUED -> DISPATCHED -> RUNNING -> COMPLETED | ERROR,
possibly through PROVISIONING / DEPLOYING while its model is brought up, and can
fail (ERROR) from any state that is not final. Anything else is a bug in the
caller, and `check_transition` says so rather than recording an impossible
history. LOG is not a state: it is a message about a job and never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from ..execution.events import FINAL_STATUSES


class Status(str, Enum):
    RECEIVED = "RECEIVED"
    QUEUED = "QUEUED"
    PROVISIONING = "PROVISIONING"
    DEPLOYING = "DEPLOYING"
    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"
    LOG = "LOG"

    @property
    def final(self) -> bool:
        """Whether the job has ended (`execution.events.FINAL_STATUSES`)."""
        return self.value in FINAL_STATUSES


#: The statuses of a job that has not ended (LOG is a line, not a status a job is in).
UNFINISHED = tuple(status for status in Status if status is not Status.LOG and not status.final)

#: The statuses of a job not yet handed to a replica: nothing of it has run.
NOT_STARTED = (Status.RECEIVED, Status.QUEUED, Status.PROVISIONING, Status.DEPLOYING)

#: Where a job waits for a replica (RECEIVED is where it enters, never returns to).
_WAITING = set(NOT_STARTED) - {Status.RECEIVED}

ALLOWED: dict[Status, set[Status]] = {
    Status.RECEIVED: _WAITING | {Status.ERROR},
    Status.QUEUED: _WAITING | {Status.DISPATCHED, Status.ERROR},
    Status.PROVISIONING: _WAITING | {Status.DISPATCHED, Status.ERROR},
    Status.DEPLOYING: _WAITING | {Status.DISPATCHED, Status.ERROR},
    # A worker that died before starting the job sends it back to the queue.
    Status.DISPATCHED: {Status.RUNNING, Status.QUEUED, Status.ERROR},
    # A graceful shutdown stops a running job and puts it back in the queue.
    Status.RUNNING: {Status.COMPLETED, Status.ERROR, Status.QUEUED},
    Status.COMPLETED: set(),
    Status.ERROR: set(),
}


class InvalidTransition(RuntimeError):
    pass


def check_transition(current: Status, new: Status) -> None:
    if new not in ALLOWED[current]:
        raise InvalidTransition(f"a job cannot go from {current.value} to {new.value}")


@dataclass
class Job:
    """The durable record of one request."""

    id: str
    user_id: int
    model_key: str
    deployment: str
    session_id: str = ""
    compress: bool = False
    env: dict[str, Any] = field(default_factory=dict)
    status: Status = Status.RECEIVED
    description: str = ""
    meta: Optional[dict[str, Any]] = None
    created_at: float = 0.0
    updated_at: float = 0.0
    #: The URL base the client reached us at, for result links.
    base_url: str = ""
    result_size: Optional[int] = None
    result_expires_at: Optional[float] = None
    #: Queued ahead of other users' jobs (the submitter was tagged ``priority``).
    priority: bool = False
    #: When the controller handed it to a replica: from then on it may have run.
    started_at: Optional[float] = None
    #: The Python the client ran on (``3.12.1``; empty when it did not say).
    client_python: str = ""
    #: The served nnsight version whose runtime runs it (``0.8.0``; empty: the server's own).
    client_version: str = ""

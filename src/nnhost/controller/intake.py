"""What a replica says about a job, checked before it may touch the job.

A replica's process runs user code, so everything that comes back from it is
untrusted input, like a request body: a forged event may name another user's
job, a job that is not running, a transition the lifecycle forbids, or carry
a huge or ill-typed description or meta. `check_event` says what is wrong
with an event (a sentence for the server's log) so the job service can drop
it: its fields by the rules the replica's parent side applies too
(`execution.events.event_problem`, where every limit on them is defined),
the job's state and lifecycle by its own. `LogBudget` caps what one job's
LOG lines may add to the database and to its client, in lines and in bytes,
whatever the worker's own cap did.

Nothing here raises on bad input, writes anything, or knows about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..execution.events import JobEvent, event_problem, is_job_id
from ..jobs.job import InvalidTransition, Job, Status, check_transition
from ..units import format_size

#: Only a job handed to a replica can hear from one.
LIVE_STATUSES = (Status.DISPATCHED, Status.RUNNING)


def event_job_id(event: Any) -> Optional[str]:
    """The event's job id if it is one we could have issued, else None (never raises)."""
    job_id = getattr(event, "job_id", None)
    return job_id if is_job_id(job_id) else None


def check_event(event: Any, job: Optional[Job], deployment: str) -> Optional[str]:
    """Why ``event`` (from a replica of ``deployment``) must be dropped, or None if it may stand."""
    if not isinstance(event, JobEvent):
        return f"not an event but a {type(event).__name__}"
    # Its fields, by the rules the replica's parent side applied (`event_problem`).
    problem = event_problem(vars(event))
    job_id = event_job_id(event)
    if problem is not None or job_id is None:  # (no valid id is a problem)
        return f"job {job_id}: an event {problem}" if job_id else f"an event {problem}"
    status = Status(event.status)
    if job is None:
        return f"job {job_id} is not known"
    if job.deployment != deployment:
        return f"job {job_id} belongs to {job.deployment}, not {deployment}"
    if job.status not in LIVE_STATUSES:
        return f"job {job_id} is {job.status.value}, not running on a replica"
    if status is not Status.LOG:
        try:
            check_transition(job.status, status)
        except InvalidTransition as error:
            return f"job {job_id}: {error}"
    return None


@dataclass
class _Spent:
    lines: int = 0
    bytes: int = 0
    cut: bool = False


class LogBudget:
    """At most ``max_lines`` LOG lines and ``max_bytes`` of them per job; then one notice.

    A line that would pass either cap is dropped, as is everything after it,
    and the first drop yields one notice line, which is the job's last LOG line.
    """

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._spent: dict[str, _Spent] = {}

    def spent(self, job_id: str) -> bool:
        """Whether ``job_id`` has used its budget (its further lines are dropped)."""
        spent = self._spent.get(job_id)
        return spent is not None and spent.cut

    def admit(self, job_id: str, line: str) -> list[str]:
        """The lines to keep and forward for ``line``: itself, nothing, or the notice."""
        spent = self._spent.setdefault(job_id, _Spent())
        if spent.cut:
            return []
        size = len(line.encode("utf-8"))
        if spent.lines + 1 <= self.max_lines and spent.bytes + size <= self.max_bytes:
            spent.lines += 1
            spent.bytes += size
            return [line]
        spent.cut = True
        return [
            f"[nnhost] Output past this point was dropped: a request may print at most "
            f"{self.max_lines} lines and {format_size(self.max_bytes)} "
            f"(this one has printed {spent.lines} lines, {format_size(spent.bytes)}). "
            "Save large values with .save() instead of printing them."
        ]

    def forget(self, job_id: str) -> None:
        self._spent.pop(job_id, None)

"""The one place the job lifecycle is watched from outside: a narrow observer.

Whatever wants to know that jobs move (metrics, a status page's history)
implements `JobObserver` and is handed to the job service; the service calls
it after every recorded change, on its event loop, with the job as stored.
This keeps `jobs` free of any exporter: it must never import one. An observer
must be quick and must not raise into the service; `Observers` shields the
service from one that does.
"""

from __future__ import annotations

import logging
from typing import Iterable, Protocol

from .job import Job
from .text import one_line

log = logging.getLogger("nnhost.jobs")


class JobObserver(Protocol):
    def job_changed(self, job: Job) -> None:
        """``job`` has just been recorded at ``job.status`` (RECEIVED when created)."""


class Observers:
    """Several observers as one; a failing observer is logged, never raised."""

    def __init__(self, observers: Iterable[JobObserver] = ()) -> None:
        self._observers = list(observers)

    def add(self, observer: JobObserver) -> None:
        self._observers.append(observer)

    def noted(self, job: Job) -> None:
        """One server log line per recorded status (the job's id in its fields), then the observers."""
        if log.isEnabledFor(logging.INFO):  # no wording work on the hot path when not logged
            log.info(
                "job %s %s on %s: %s", job.id, job.status.value, job.deployment,
                one_line(job.description),
                extra={"job_id": job.id, "status": job.status.value, "model": job.deployment,
                       "user_id": job.user_id},
            )
        self.job_changed(job)

    def job_changed(self, job: Job) -> None:
        for observer in self._observers:
            try:
                observer.job_changed(job)
            except Exception:
                log.exception("a job observer failed on %s", job.id)

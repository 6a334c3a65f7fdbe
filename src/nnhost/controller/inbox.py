"""What the controller's parts report, queued until its control loop takes them in.

Why it exists: the deployment manager (replica events, state changes, idle
replicas) and the on-demand fetcher (progress, a model ready, a fetch that
failed) are built before the job service, which needs them; they post
reports here instead of holding the service, and the controller's loop
(`loop.Controller.tick`) hands every queued report to the service, in
arrival order, as the first step of each tick. So the parts are built in
dependency order, nothing holds a reference that is still unset, and the
job service's logic runs from one loop rather than from callbacks scheduled
wherever a report came from. Posting wakes the loop at once: a report waits
for nothing but the step in progress.

It is used on the controller's event loop only (the manager hops replica
threads' callbacks onto it before posting), so it needs no locks. It must
never decide anything itself: it only queues and delivers; a report that
fails to be handled is logged, and the next one is delivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Optional, Protocol, Union

from ..execution.events import JobEvent

log = logging.getLogger("nnhost.jobs")


class Handler(Protocol):
    """What handles the reports: the job service."""

    def on_job_event(self, name: str, event: JobEvent) -> None:
        """A replica of deployment ``name`` reported ``event`` (untrusted)."""

    def on_change(self, name: str) -> None:
        """Deployment ``name`` changed state, or one of its replicas became idle."""

    def pump(self, name: str) -> None:
        """Deployment ``name``'s download moved on: its waiting jobs are told."""

    def fetch_failed(self, name: str, reason: str) -> None:
        """Deployment ``name``, fetched on demand, cannot be had."""


@dataclass(frozen=True)
class JobReported:
    name: str
    event: JobEvent


@dataclass(frozen=True)
class Changed:
    name: str


@dataclass(frozen=True)
class FetchMoved:
    name: str


@dataclass(frozen=True)
class FetchFailed:
    name: str
    reason: str


Report = Union[JobReported, Changed, FetchMoved, FetchFailed]


def deliver(report: Report, handler: Handler) -> None:
    match report:
        case JobReported(name, event):
            handler.on_job_event(name, event)
        case Changed(name):
            handler.on_change(name)
        case FetchMoved(name):
            handler.pump(name)
        case FetchFailed(name, reason):
            handler.fetch_failed(name, reason)


class Inbox:
    def __init__(self) -> None:
        self._reports: deque[Report] = deque()
        #: Set when a report arrives or the loop is nudged; cleared when the loop wakes.
        self._arrived = asyncio.Event()

    def __len__(self) -> int:
        return len(self._reports)

    # -- posting (the manager's and the fetcher's callbacks) ----------------------------

    def post(self, report: Report) -> None:
        self._reports.append(report)
        self._arrived.set()

    def job_event(self, name: str, event: JobEvent) -> None:
        self.post(JobReported(name, event))

    def changed(self, name: str) -> None:
        self.post(Changed(name))

    def fetch_progress(self, name: str) -> None:
        self.post(FetchMoved(name))

    def fetch_failed(self, name: str, reason: str) -> None:
        self.post(FetchFailed(name, reason))

    def nudge(self) -> None:
        """Wake the loop without a report (something else it watches needs a look)."""
        self._arrived.set()

    # -- taking in (the control loop) ---------------------------------------------------

    def drain(self, handler: Handler) -> int:
        """Deliver every queued report to ``handler``, oldest first (those posted meanwhile
        too); how many."""
        delivered = 0
        while self._reports:
            report = self._reports.popleft()
            delivered += 1
            try:
                deliver(report, handler)
            except Exception:
                log.exception("could not take in %s", report)
        return delivered

    async def wait(self, timeout: Optional[float]) -> None:
        """Return once a report is queued or the loop is nudged, or after ``timeout`` seconds."""
        if not self._reports:
            try:
                async with asyncio.timeout(timeout):
                    await self._arrived.wait()
            except TimeoutError:
                pass
        self._arrived.clear()

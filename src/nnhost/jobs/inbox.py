"""What the controller's parts report, and the one way it reaches the job service.

Why it exists: the deployment manager (replica events, state changes, idle
replicas) and the on-demand fetcher (progress, a model ready, a fetch that
failed) are built before the job service, which needs them; they report to
this inbox instead of holding the service. The controller builds the inbox
first, gives its methods to those parts as their callbacks, and connects the
job service to it once, after building it. So the parts are built in
dependency order, and nothing holds a reference that is still unset.

It runs on the controller's event loop (the manager hops replica threads'
callbacks onto it first). It must never decide anything itself: it only
delivers; and it refuses a second connection, or a report before the first.
"""

from __future__ import annotations

from typing import Optional, Protocol

from ..execution.events import JobEvent


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


class Inbox:
    def __init__(self) -> None:
        self._handler: Optional[Handler] = None

    def connect(self, handler: Handler) -> None:
        """Deliver every report to ``handler`` from now on (once, as the controller is built)."""
        if self._handler is not None:
            raise RuntimeError("the controller's inbox is connected already")
        self._handler = handler

    @property
    def handler(self) -> Handler:
        if self._handler is None:
            raise RuntimeError("a report reached the controller before it was built")
        return self._handler

    def job_event(self, name: str, event: JobEvent) -> None:
        self.handler.on_job_event(name, event)

    def changed(self, name: str) -> None:
        self.handler.on_change(name)

    def fetch_progress(self, name: str) -> None:
        self.handler.pump(name)

    def fetch_failed(self, name: str, reason: str) -> None:
        self.handler.fetch_failed(name, reason)

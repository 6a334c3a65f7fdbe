"""The client's view of a job: `Response` messages, and links to results.

The job service records and publishes facts (`jobs.job.Job`,
`jobs.update.JobUpdate`); here they become what the nnsight client parses: a
JSON `Response`, with a signed result link on COMPLETED (for the address this
client used, or ``public_url``), or, when a small result rides along, the
``torch.save`` bytes of the whole response as a binary frame.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Optional

from ..jobs.bus import Frame
from ..jobs.job import Job, Status
from ..jobs.update import JobUpdate
from ..wire import Response

if TYPE_CHECKING:
    from .server import Server

log = logging.getLogger("nnhost.api")
#: Shortest lifetime of a result link, even for a result about to expire.
MIN_LINK_TTL = 60.0


def result_url(server: Server, job_id: str, expires_at: Optional[float], base_url: str) -> Optional[str]:
    if expires_at is None:
        return None
    base = (server.settings.public_url or base_url).rstrip("/")
    ttl = max(MIN_LINK_TTL, expires_at - time.time())
    return server.results.signed_url(job_id, ttl, base)


def _response(server: Server, job_id: str, status: Status, description: str, meta: Optional[dict[str, Any]],
              expires_at: Optional[float], base_url: str, inline: Optional[bytes] = None) -> Response:
    """What the client parses for a job at ``status``: ``data`` is the inline result, or
    on COMPLETED a signed link; ``meta`` only once the job has ended."""
    data: object = inline
    if status is Status.COMPLETED and inline is None:
        data = result_url(server, job_id, expires_at, base_url)
    return Response(id=job_id, status=status.value, description=description, data=data,
                    meta=meta if status.final else None)


def job_response(server: Server, job: Job, base_url: str) -> Response:
    """The Response for ``job`` as it stands (a link when it COMPLETED)."""
    return _response(server, job.id, job.status, job.description, job.meta,
                     job.result_expires_at, base_url)


def published_update(published: Frame) -> Optional[JobUpdate]:
    """A frame from the event bus as the job update it should be; None (logged) for one that is not."""
    try:
        return JobUpdate.decode(published)
    except (ValueError, TypeError):
        log.warning("dropped a frame on the event bus that is not a job update")
        return None


def update_response(server: Server, update: JobUpdate, inline: bool = True) -> Response:
    """The Response for a published update (with its inline result, if it has one and ``inline``)."""
    status = Status(update.status)
    data = update.inline if inline and status is Status.COMPLETED else None
    return _response(server, update.job_id, status, update.description, update.meta,
                     update.result_expires_at, update.base_url, data)


def update_frame(server: Server, update: JobUpdate) -> str | bytes:
    """The websocket frame for a published update: JSON text, or bytes with an inline result."""
    response = update_response(server, update)
    return response.pickle() if isinstance(response.data, bytes) else response.model_dump_json()

"""The client's view of a job: `Response` messages, and links to results.

The job service records and publishes facts (`jobs.job.Job`,
`jobs.update.JobUpdate`); here they become what the nnsight client parses: a
JSON `Response`, with a signed result link on COMPLETED (for the address this
client used, or ``public_url``), or, when a small result rides along, the
``torch.save`` bytes of the whole response as a binary frame.
"""

from __future__ import annotations

import time
from typing import Optional

from ..jobs.job import Job, Status
from ..jobs.update import JobUpdate
from ..wire import Response

#: Shortest lifetime of a result link, even for a result about to expire.
MIN_LINK_TTL = 60.0


def result_url(server, job_id: str, expires_at: Optional[float], base_url: str) -> Optional[str]:
    if expires_at is None:
        return None
    base = (server.settings.public_url or base_url).rstrip("/")
    ttl = max(MIN_LINK_TTL, expires_at - time.time())
    return server.results.signed_url(job_id, ttl, base)


def job_response(server, job: Job, base_url: str) -> Response:
    """The Response for ``job`` as it stands (a link when it COMPLETED)."""
    data = None
    if job.status is Status.COMPLETED:
        data = result_url(server, job.id, job.result_expires_at, base_url)
    return Response(
        id=job.id,
        status=job.status.value,
        description=job.description,
        data=data,
        meta=job.meta if job.status.final else None,
    )


def update_frame(server, update: JobUpdate) -> str | bytes:
    """The websocket frame for a published update: JSON text, or bytes with an inline result."""
    status = Status(update.status)
    meta = update.meta if status.final else None
    if status is Status.COMPLETED and update.inline is not None:
        return Response(
            id=update.job_id, status=status.value, description=update.description,
            data=update.inline, meta=meta,
        ).pickle()
    data = None
    if status is Status.COMPLETED:
        data = result_url(server, update.job_id, update.result_expires_at, update.base_url)
    return Response(
        id=update.job_id, status=status.value, description=update.description,
        data=data, meta=meta,
    ).model_dump_json()

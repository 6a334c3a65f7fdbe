"""The protocol of nnsight clients before 0.8: a raw request body, and updates as pickled dicts.

Why it exists: nnsight 0.6 and 0.7 (the clients a runtime of theirs serves,
`nnhost.runtimes`) speak an older protocol than the one `protocol` serves
to 0.8. They open a Socket.IO session first (`socketio_front`), then POST
``/request`` with the serialized request as the whole body and its
settings in headers (``nnsight-model-key``, ``nnsight-compress``,
``ndif-session_id``), and they expect every later update on the Socket.IO
session as an event whose data is ``torch.save`` of the response dict,
whose status is one of theirs, and whose COMPLETED ``data`` is a link to
the result (they download anything but a dict). Polling ``/response`` is
the same JSON as 0.8's, with their statuses.

Here those differences are translated to and from the job service's own
terms (`front.jobs.Submission`, `jobs.update.JobUpdate`); it decides nothing
about who may submit (`deps`) and never reads the payload.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from ..front.jobs import Submission
from ..jobs.job import Job, Status
from ..jobs.update import JobUpdate
from ..wire import Response
from . import replies

if TYPE_CHECKING:
    from .server import Server

#: The statuses these clients know; ours that they do not are shown as the nearest they do.
_THEIR_STATUS = {Status.PROVISIONING: Status.QUEUED, Status.DEPLOYING: Status.QUEUED}
#: The event their clients receive on (any name: they read the data of the next event).
EVENT = "job_update"


def submission(headers: Any) -> Submission:
    """What a raw-body request asks for, from its headers."""
    return Submission(
        model_key=headers.get("nnsight-model-key", ""),
        session_id=headers.get("ndif-session_id", ""),
        compress=headers.get("nnsight-compress", "").strip().lower() == "true",
        env={},
    )


def their_response(response: Response) -> Response:
    """``response`` as these clients parse it: a status they know, a link for a result."""
    status = Status(response.status)
    return response.model_copy(update={"status": _THEIR_STATUS.get(status, status).value})


def job_response(server: Server, job: Job, base_url: str) -> Response:
    return their_response(replies.job_response(server, job, base_url))


def update_event(server: Server, update: JobUpdate) -> bytes:
    """The Socket.IO event data for a published update: ``torch.save`` of the response dict.

    Never the result itself: their clients download whatever is not a dict,
    so COMPLETED carries the link even when the result also rode inline.
    """
    import torch

    response = their_response(replies.update_response(server, update, inline=False))
    buffer = io.BytesIO()
    torch.save(response.model_dump(exclude_none=True), buffer)
    return buffer.getvalue()

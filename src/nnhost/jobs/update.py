"""What the job service publishes about a job: facts, not the client's wire format.

A `JobUpdate` says what happened to a job (its status, description and
metadata, and on COMPLETED when its result expires and, for a small result,
its bytes); it travels over the event bus to whichever API process holds the
job's websocket, and that process frames it for the client (`api.replies`),
with a result link signed for the address the client used. So the job service
never builds the client's messages, and a controller on another machine
needs to know nothing of HTTP.

It travels as bytes: a JSON header line, then the inline result if any. The
model declares every rule a header must meet (its fields, their types, a job
id the server could have issued, a status a job can have), and `decode`
applies them in one place: a frame that does not meet them is refused with
`ValueError`. The bus is shared with other processes, so what arrives on it
is untrusted, like anything a process did not make itself. This module must
never build a client's frame nor know of HTTP.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from .job import Status
from .messages import JobId, problems

#: The first bytes of every encoded update, so a frame of another kind is told apart.
MAGIC = b"nnhost-update:"

def _known_status(value: str) -> str:
    Status(value)  # ValueError, which pydantic reports, for a status no job has
    return value


#: A job's status by its name (`jobs.job.Status`), as the client's frames carry it.
StatusName = Annotated[str, AfterValidator(_known_status)]


class JobUpdate(BaseModel):
    """One update of one job, as published on the bus; checked when built and when decoded."""

    # Frozen: an update is a fact once published. Strict and closed: the header
    # comes from another process, so nothing is coerced and no key is ignored.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    job_id: JobId
    status: StatusName
    description: str
    #: The job's metadata (runtime, memory) once it has ended.
    meta: Optional[dict[str, Any]] = None
    #: The address the client submitted to, for its result link.
    base_url: str = ""
    #: On COMPLETED: when the stored result is deleted (the link must expire first).
    result_expires_at: Optional[float] = None
    #: On COMPLETED, a result small enough to ride along in the websocket frame.
    inline: Optional[bytes] = None

    def encode(self) -> bytes:
        header = self.model_dump(exclude={"inline"})
        header["inline"] = self.inline is not None
        return MAGIC + json.dumps(header).encode() + b"\n" + (self.inline or b"")

    @classmethod
    def decode(cls, frame: object) -> "JobUpdate":
        """The update ``frame`` encodes; `ValueError` saying why for anything else."""
        if not isinstance(frame, bytes) or not frame.startswith(MAGIC):
            raise ValueError("not a job update")
        header_line, _, rest = frame[len(MAGIC):].partition(b"\n")
        try:
            header = json.loads(header_line)
        except ValueError:
            raise ValueError("a job update's header is not JSON") from None
        if not isinstance(header, dict):
            raise ValueError("a job update's header is not an object")
        has_inline = header.pop("inline", False)
        if not isinstance(has_inline, bool):
            raise ValueError("a job update's inline flag is not true or false")
        try:
            return cls.model_validate({**header, "inline": bytes(rest) if has_inline else None})
        except ValidationError as error:
            raise ValueError(f"a malformed job update: {problems(error)}") from None

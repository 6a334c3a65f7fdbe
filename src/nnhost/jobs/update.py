"""What the job service publishes about a job: facts, not the client's wire format.

A `JobUpdate` says what happened to a job (its status, description and
metadata, and on COMPLETED when its result expires and, for a small result,
its bytes); it travels over the event bus to whichever API process holds the
job's websocket, and that process frames it for the client (`api.replies`),
with a result link signed for the address the client used. So the job service
never builds the client's messages, and a controller on another machine
needs to know nothing of HTTP.

It travels as bytes: a JSON header line, then the inline result if any. A
frame that does not decode is refused with `ValueError` (the bus is shared
with other processes: what arrives on it is checked, like anything a process
did not make itself).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Optional

#: The first bytes of every encoded update, so a frame of another kind is told apart.
MAGIC = b"nnhost-update:"


@dataclass(frozen=True)
class JobUpdate:
    job_id: str
    status: str
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
        header = {k: v for k, v in asdict(self).items() if k != "inline"}
        header["inline"] = self.inline is not None
        return MAGIC + json.dumps(header).encode() + b"\n" + (self.inline or b"")

    @classmethod
    def decode(cls, frame: Any) -> "JobUpdate":
        if not isinstance(frame, bytes) or not frame.startswith(MAGIC):
            raise ValueError("not a job update")
        header_line, _, rest = frame[len(MAGIC):].partition(b"\n")
        header = json.loads(header_line)
        if not isinstance(header, dict):
            raise ValueError("a job update's header is not an object")
        has_inline = header.pop("inline", False) is True
        try:
            update = cls(**header, inline=bytes(rest) if has_inline else None)
        except TypeError as error:
            raise ValueError(f"a job update has unknown fields: {error}") from None
        if not isinstance(update.job_id, str) or not isinstance(update.status, str):
            raise ValueError("a job update without a job id or status")
        if update.meta is not None and not isinstance(update.meta, dict):
            raise ValueError("a job update's meta is not an object")
        return update

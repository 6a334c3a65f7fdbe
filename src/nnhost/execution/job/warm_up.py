"""Warming a process up on the server's own request, before any job's process is forked from it.

Why it exists: every job's process starts as a copy of the host (or the
template), so whatever that parent has done once is done in every job. It
runs the server's own request, never a user's, through the whole job path.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional

from ..events import JobEvent, JobSpec
from ..nnsight_api import current

if TYPE_CHECKING:
    from .runner import Runner

#: The warm-up's request (the server's own, never a user's), serialized for this process's model.
_own_request: Optional[bytes] = None


def warm_up(model: Any, runner: Runner) -> Optional[str]:
    """Run one request of our own through the whole job path, in the host, before any fork.

    Every job process starts as a copy of the host: whatever the host has
    already done once (imports done lazily, nnsight's compiled tracing code,
    torch's dispatch caches, the unpickler's and the serializer's first use)
    each job process inherits done, instead of paying for it on every request.
    It runs with one torch thread (see `host`). Returns why it failed, or None.
    """
    global _own_request
    try:
        if _own_request is None:
            # Traced and serialized once, by the process that forks: every job
            # process inherits it and warms up on the run alone.
            _own_request = current().own_request(model, "Hello, world. The city of")
        payload = os.memfd_create("warm-up-payload", os.MFD_CLOEXEC)
        result = os.memfd_create("warm-up-result", os.MFD_CLOEXEC)
        os.write(payload, _own_request)
        os.lseek(payload, 0, os.SEEK_SET)
        events: list[JobEvent] = []
        runner.run(JobSpec("warm-up", "", True, payload_fd=payload, result_fd=result), events.append)
        final = events[-1] if events else None
        if final is None or final.status != "COMPLETED":
            return final.description if final is not None else "no final event"
        return None
    except Exception as error:  # a model whose forward needs other inputs: no warm-up
        return f"{type(error).__name__}: {error}"

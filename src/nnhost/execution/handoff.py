"""Handing a contained worker the two files of its job, and nothing else.

A contained worker cannot see the server's data directory (the payloads and
results of every user, the database). The server opens the job's payload for
reading and its result file for writing, and passes the two open descriptors
with the job's own message on the process's channel (``SCM_RIGHTS``). The worker
reads the one and writes the other; it never learns a path.

The server side (`send_job`, `discard_result`) runs in the replica's process;
the job side (`receive_job`) in the job's process. Neither knows about HTTP or
the job database.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from .events import JobSpec

def send_job(channel: Any, spec: JobSpec) -> None:
    """Send ``{"type": "run", "job": ...}`` with the job's payload and result descriptors."""
    payload_fd = os.open(spec.payload_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        result_fd = os.open(
            spec.result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
        )
    except BaseException:
        os.close(payload_fd)
        raise
    try:
        job = spec.to_dict()
        job.update(payload_path="", result_path="", payload_fd=-1, result_fd=-1)
        channel.send({"type": "run", "job": job}, [payload_fd, result_fd])
    finally:
        os.close(payload_fd)
        os.close(result_fd)


def receive_job(message: dict, fds: list) -> JobSpec:
    """In the job's process: the spec of a ``run`` message, with its two descriptors."""
    if message.get("type") != "run" or len(fds) != 2:
        raise OSError("the server did not send a job with its two files")
    spec = JobSpec(**message["job"])
    spec.payload_fd, spec.result_fd = fds
    return spec


def discard_result(spec: Optional[JobSpec]) -> None:
    """Remove the result file `send_job` created for a job that failed.

    Called only for a job that ended with ERROR or never reported its end:
    whatever its process wrote there (up to the largest result, however
    large) is nobody's result, and must not sit on disk uncounted.
    """
    if spec is None or not spec.result_path:
        return
    try:
        os.unlink(spec.result_path)
    except OSError:
        pass

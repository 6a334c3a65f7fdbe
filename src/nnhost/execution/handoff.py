"""Handing a contained worker the two files of its job, and nothing else.

A contained worker cannot see the server's data directory (the payloads and
results of every user, the database). The server opens the job's payload for
reading and its result file for writing, and passes the two open descriptors
over the worker's pipe (``SCM_RIGHTS``) right after the job itself. The worker
reads the one and writes the other; it never learns a path.

The server side (`send_job`, `discard_result`) runs in the replica's process;
the worker side (`receive_files`) in the worker. Neither knows about HTTP or
the job database.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Optional

from .events import JobSpec

#: Set in the job dict sent to the worker when its files follow as descriptors.
HANDOFF_KEY = "files_follow"


def send_job(connection: Any, spec: JobSpec) -> None:
    """Send ``("run", spec)`` and then the job's payload and result descriptors.

    The ``started`` marker, which the worker itself cannot create, is made
    here: the worker starts on a job the moment it receives it.
    """
    payload_fd = os.open(spec.payload_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        result_fd = os.open(
            spec.result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
        )
    except BaseException:
        os.close(payload_fd)
        raise
    try:
        if spec.started_path:
            with open(spec.started_path, "wb"):
                pass
        message = spec.to_dict()
        message.update(payload_path="", result_path="", started_path="", **{HANDOFF_KEY: True})
        connection.send(("run", message))
        with socket.socket(fileno=os.dup(connection.fileno())) as channel:
            socket.send_fds(channel, [b"F"], [payload_fd, result_fd])
    finally:
        os.close(payload_fd)
        os.close(result_fd)


def receive_files(connection: Any, message: dict) -> tuple[Optional[int], Optional[int]]:
    """In the worker: the job's (payload fd, result fd), when the server sent them."""
    if not message.pop(HANDOFF_KEY, False):
        return None, None
    with socket.socket(fileno=os.dup(connection.fileno())) as channel:
        _, fds, _, _ = socket.recv_fds(channel, 1, 2)
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        raise OSError("the server did not send the job's files")
    return fds[0], fds[1]


def discard_result(spec: Optional[JobSpec]) -> None:
    """Remove the empty result file `send_job` created for a job that did not complete.

    Only an empty file goes: a job that completed just before its worker was
    replaced keeps its result.
    """
    if spec is None or not spec.result_path:
        return
    try:
        if os.path.getsize(spec.result_path) == 0:
            os.unlink(spec.result_path)
    except OSError:
        pass

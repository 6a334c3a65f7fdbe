"""Handing a contained worker the files of its job, and nothing else.

A contained worker cannot see the server's data directory (the payloads and
results of every user, the database). The server opens the job's payload for
reading and its result file for writing, and passes the two open descriptors
with the job's own message on the process's channel (``SCM_RIGHTS``). The worker
reads the one and writes the other; it never learns a path.

A job that names a PEFT adapter also gets that adapter's files, opened
read-only by the server from its model cache (`models.adapters` found them),
which the job's process never sees: `unpack_adapter` copies them into a folder
of the job's own private ``/tmp`` for peft to read. Only that adapter's files
travel, never a folder of the cache.

The server side (`send_job`, `discard_result`) runs in the replica's process;
the job side (`receive_job`) in the job's process. Neither knows about HTTP or
the job database.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from typing import Optional

from ..models.adapters import ADAPTER_FILES, MAX_ADAPTER_BYTES
from .channel import Channel
from .events import JobSpec
from .messages import Run


def send_job(channel: Channel, spec: JobSpec, stay_within: int = 0) -> None:
    """Send the job (`messages.Run`) with its payload, result and adapter descriptors.

    ``stay_within``: the process may wait for its owner's next job afterwards (`messages.Run`).
    """
    payload_fd = os.open(spec.payload_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        result_fd = os.open(
            spec.result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
        )
    except BaseException:
        os.close(payload_fd)
        raise
    adapter_fds: list[int] = []
    try:
        for name in ADAPTER_FILES if spec.adapter_path else ():
            adapter_fds.append(os.open(os.path.join(spec.adapter_path, name), os.O_RDONLY | os.O_CLOEXEC))
        job = replace(spec, payload_path="", result_path="", payload_fd=-1, result_fd=-1,
                      adapter_path="", adapter_fds=[-1] * len(adapter_fds), owner="", runtime="")
        channel.send(Run(job=job, stay_within=stay_within), [payload_fd, result_fd, *adapter_fds])
    finally:
        for fd in (payload_fd, result_fd, *adapter_fds):
            os.close(fd)


def receive_job(message: Run, fds: list[int]) -> JobSpec:
    """In the job's process: the spec of its `messages.Run`, with its descriptors."""
    spec = replace(message.job)
    if len(fds) != 2 + len(spec.adapter_fds) or len(spec.adapter_fds) not in (0, len(ADAPTER_FILES)):
        raise OSError("the server did not send a job with its files")
    spec.payload_fd, spec.result_fd = fds[:2]
    spec.adapter_fds = list(fds[2:])
    return spec


def unpack_adapter(spec: JobSpec) -> Optional[str]:
    """The job's adapter as a folder of its own (None without one); the caller removes it.

    Copied from the descriptors the server handed over, into this process's
    private ``/tmp`` (a contained job's own tmpfs), before any of the job's code
    has been read.
    """
    if not spec.adapter_fds:
        return None
    folder = tempfile.mkdtemp(prefix="nnhost-adapter-")
    budget = MAX_ADAPTER_BYTES
    for name, fd in zip(ADAPTER_FILES, spec.adapter_fds):
        with os.fdopen(os.dup(fd), "rb") as source, open(os.path.join(folder, name), "wb") as target:
            while chunk := source.read(1 << 20):
                budget -= len(chunk)
                if budget < 0:
                    raise OSError("the adapter is larger than the server allows")
                target.write(chunk)
    return folder


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

"""Request payloads on the local disk, named by job id.

A submitted job's payload is written here before the job is recorded, so a
restart loses nothing that was accepted; the replica's process opens it for the
worker (it travels as a descriptor, never as a path). Payloads never leave
this machine: results, which may, live behind `storage.results.ResultStore`.
For API processes and a controller on other machines, `payloads.DatabasePayloads`
keeps them in the shared database instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..execution.events import is_job_id


def check_job_id(job_id: str) -> str:
    """A job id is a file or object name here: the one rule (`execution.events.is_job_id`)."""
    if not is_job_id(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    return job_id


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees all of it or nothing.

    Not flushed to the disk (no fsync): a blob is as durable as the job row
    that names it, which SQLite commits with ``synchronous=NORMAL``. A crash
    of nnhost loses neither; a power cut may lose the last moments of both,
    and a job whose payload went with it ends in ERROR, not silently. The
    fsync cost 0.5-0.7 ms of every submission's path on a busy disk.
    """
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as file:
        file.write(data)
    os.replace(partial, path)


class BlobDir:
    """A folder of blobs named by job id."""

    def __init__(self, root: Path, suffix: str) -> None:
        self.root = root
        self.suffix = suffix
        root.mkdir(parents=True, exist_ok=True)

    def path(self, job_id: str) -> Path:
        return self.root / f"{check_job_id(job_id)}{self.suffix}"

    def fetch_to_file(self, job_id: str) -> Path:
        """The blob's file (`payloads.JobPayloads`): it is already on this machine."""
        return self.path(job_id)

    def write(self, job_id: str, data: bytes) -> Path:
        path = self.path(job_id)
        write_file(path, data)
        return path

    def exists(self, job_id: str) -> bool:
        return self.path(job_id).is_file()

    def size(self, job_id: str) -> Optional[int]:
        try:
            return self.path(job_id).stat().st_size
        except OSError:
            return None

    def read(self, job_id: str) -> bytes:
        return self.path(job_id).read_bytes()

    def delete(self, job_id: str) -> None:
        try:
            self.path(job_id).unlink()
        except FileNotFoundError:
            pass

"""Where accepted request payloads wait until a replica runs them.

`JobPayloads` is what the job services need: write a payload (the API, when
it accepts a request), know it is there, fetch it into a file on this
machine for the replica to hand to the worker as a descriptor, and delete it
when the job ends. Every method blocks (disk or database): code on the event
loop calls them through `storage.blocking.run_blocking`. Two implementations:

- `storage.blobs.BlobDir`: files in the data directory, for one process
  (``role = "all"``), where the API and the controller share a disk.
- `DatabasePayloads`: rows of the shared database, for API processes and a
  controller that may be on different machines. The controller copies a
  payload to its own spool directory the first time a replica needs it, so
  the replica's hand-off is the same as on one machine; a controller that
  takes over reads the rows again.

Payloads never leave the server's own storage (unlike results, which go to
`results.ResultStore` and may be downloaded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from sqlalchemy import delete, insert, select

from ..db import Database
from ..db.tables import job_payloads
from .blobs import BlobDir, check_job_id


class JobPayloads(Protocol):
    """Blocking: call from a thread, or on the loop through `run_blocking`."""

    def write(self, job_id: str, data: bytes) -> object: ...

    def exists(self, job_id: str) -> bool: ...

    def fetch_to_file(self, job_id: str) -> Path:
        """A file on this machine holding the payload (for the replica's hand-off).

        May copy the payload there first (from the database, for
        `DatabasePayloads`); raises `FileNotFoundError` if none is stored.
        """

    def delete(self, job_id: str) -> None: ...


class DatabasePayloads:
    """Payloads in the shared database, spooled to ``spool`` on the machine that runs them."""

    def __init__(self, database: Database, spool: BlobDir) -> None:
        self.database = database
        self.spool = spool

    def write(self, job_id: str, data: bytes) -> None:
        with self.database.write() as db:
            db.execute(insert(job_payloads).values(job_id=check_job_id(job_id), data=data))

    def exists(self, job_id: str) -> bool:
        query = select(job_payloads.c.job_id).where(job_payloads.c.job_id == job_id)
        with self.database.read() as db:
            return db.execute(query).first() is not None

    def fetch_to_file(self, job_id: str) -> Path:
        """Read the payload from the database into the spool file, once; that file's path."""
        if not self.spool.exists(job_id):
            query = select(job_payloads.c.data).where(job_payloads.c.job_id == job_id)
            with self.database.read() as db:
                data = db.execute(query).scalar()
            if data is None:
                raise FileNotFoundError(f"no payload is stored for job {job_id}")
            self.spool.write(job_id, bytes(data))
        return self.spool.path(job_id)

    def delete(self, job_id: str) -> None:
        self.spool.delete(job_id)
        with self.database.write() as db:
            db.execute(delete(job_payloads).where(job_payloads.c.job_id == job_id))

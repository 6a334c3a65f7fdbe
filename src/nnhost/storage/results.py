"""Where finished results live: one interface, a directory or an S3 bucket behind it.

A worker never talks to the store. It writes its result into a local file the
server opened for it (`ResultStore.staging_path`, handed over as a descriptor);
when the worker reports COMPLETED the server `commit`s that file into the
store (a rename for a directory, an upload for S3) and only then announces the
job, with the size the store reports, not the one the worker claimed. Clients
download by `signed_url`: for a directory, this server's own ``/result/{id}``
link signed with `LinkSigner`; for S3, a presigned URL of the object itself.
Results are deleted by the job service's sweep when their retention ends
(`delete`), and `expire` removes whatever the database has forgotten (a crash
between upload and record).

The stores know nothing of jobs, HTTP routes or the database; they never run
on the event loop when ``remote`` is true (the caller hops to a thread).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Optional, Protocol, runtime_checkable

from .blobs import check_job_id, write_file
from .links import LinkSigner

#: The ``/result/{id}`` route a directory store's links point at (served by api/protocol.py).
RESULT_ROUTE = "/result"
#: Name endings of a directory store's files: stored, staged by a worker, being written.
STORED, STAGED, PARTIAL = ".result", ".result.staged", ".partial"


class ResultStoreError(RuntimeError):
    """The result store cannot be used; the message says what to fix."""


class ResultMissing(LookupError):
    """No stored result for this job (never written, or already deleted)."""


@runtime_checkable
class ResultStore(Protocol):
    #: Whether calls go over the network (then never call them on the event loop).
    remote: bool

    @property
    def location(self) -> str:
        """Where results are kept, for logs and messages (a path, or s3://bucket/prefix)."""

    def check(self) -> None:
        """Raise `ResultStoreError` (with what to do) unless results can be written and read."""

    def staging_path(self, job_id: str) -> Path:
        """The local file a worker writes ``job_id``'s result into."""

    def commit(self, job_id: str) -> Optional[int]:
        """Make the staged file (if any) the stored result; the stored size, or None."""

    def write(self, job_id: str, data: bytes) -> int:
        """Store ``data`` as ``job_id``'s result directly; returns the stored size."""

    def open(self, job_id: str) -> BinaryIO:
        """The stored result for reading (raises `ResultMissing`); the caller closes it."""

    def read(self, job_id: str) -> bytes:
        """The whole stored result (raises `ResultMissing`)."""

    def size(self, job_id: str) -> Optional[int]:
        """The stored result's size in bytes, or None if there is none."""

    def exists(self, job_id: str) -> bool:
        """Whether a result is stored for ``job_id``."""

    def signed_url(self, job_id: str, ttl: float, base_url: str) -> str:
        """A URL that gets the result with a plain GET (no key, no redirect) for ``ttl`` seconds.

        ``base_url`` is where clients reach this server (a store that serves
        its own links ignores it).
        """

    def delete(self, job_id: str) -> None:
        """Remove the stored result and any staged file (nothing there is not an error)."""

    def expire(self, before: float) -> int:
        """Remove results and staged files last written before ``before``; returns how many results."""


class DirectoryStore:
    """Results as files in one folder (local, or shared by every machine), served by this server."""

    remote = False

    def __init__(self, root: Path, signer: LinkSigner) -> None:
        self.root = Path(root)
        self.signer = signer
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ResultStoreError(
                f"cannot make the results directory {self.root}: {error.strerror}; "
                "create it, or choose another with --results"
            ) from None

    @property
    def location(self) -> str:
        return str(self.root)

    def check(self) -> None:
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ResultStoreError(
                f"the results directory {self.root} is not writable by this user; "
                "fix its permissions or choose another with --results"
            )

    def _stored(self, job_id: str) -> Path:
        return self.root / f"{check_job_id(job_id)}{STORED}"

    def staging_path(self, job_id: str) -> Path:
        return self.root / f"{check_job_id(job_id)}{STAGED}"

    def commit(self, job_id: str) -> Optional[int]:
        try:
            os.replace(self.staging_path(job_id), self._stored(job_id))
        except FileNotFoundError:
            pass
        return self.size(job_id)

    def write(self, job_id: str, data: bytes) -> int:
        write_file(self._stored(job_id), data)
        return len(data)

    def open(self, job_id: str) -> BinaryIO:
        try:
            return open(self._stored(job_id), "rb")
        except FileNotFoundError:
            raise ResultMissing(job_id) from None

    def read(self, job_id: str) -> bytes:
        with self.open(job_id) as file:
            return file.read()

    def size(self, job_id: str) -> Optional[int]:
        try:
            return self._stored(job_id).stat().st_size
        except OSError:
            return None

    def exists(self, job_id: str) -> bool:
        return self._stored(job_id).is_file()

    def signed_url(self, job_id: str, ttl: float, base_url: str) -> str:
        query = self.signer.query(check_job_id(job_id), ttl)
        return f"{base_url.rstrip('/')}{RESULT_ROUTE}/{job_id}?{query}"

    def delete(self, job_id: str) -> None:
        for path in (self._stored(job_id), self.staging_path(job_id)):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def expire(self, before: float) -> int:
        removed = 0
        with os.scandir(self.root) as entries:
            for entry in entries:
                if not entry.name.endswith((STORED, STAGED, PARTIAL)):
                    continue
                try:
                    if entry.stat().st_mtime >= before:
                        continue
                    os.unlink(entry.path)
                except FileNotFoundError:
                    continue
                removed += entry.name.endswith(STORED)
        return removed


def open_result_store(
    results: str, endpoint: Optional[str], *, spool: Path, signer: LinkSigner
) -> ResultStore:
    """The store a ``results`` setting names: ``s3://BUCKET[/PREFIX]`` or a directory.

    ``spool`` is the local folder an S3 store stages workers' results in
    before uploading them.
    """
    from .s3 import is_s3_url

    if is_s3_url(results):
        from .s3 import S3Store

        return S3Store(results, endpoint=endpoint, spool=spool)
    return DirectoryStore(Path(results), signer)


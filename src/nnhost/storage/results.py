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

The stores know nothing of jobs, HTTP routes or the database. Two contracts
say which calls block:

- `ResultStore`, the blocking side: every method may wait on a disk or the
  network. The worker's side, the sweep (in a thread) and tools call it.
- `AsyncResultStore`, the store as code on the event loop calls it
  (``store.on_loop()``): its I/O methods are coroutines, and `run_then` runs
  a blocking step where this store's I/O belongs. Each store says which:
  `DirectoryStore`'s calls are a rename, stat or open on this machine's disk
  and run in place (`InPlaceResults`); `S3Store`'s cross the network and run
  in a thread (`ThreadedResults`, through `blocking.run_blocking`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional, Protocol, TypeVar, runtime_checkable

from .blobs import check_job_id, write_file
from .blocking import run_blocking
from .links import LinkSigner

log = logging.getLogger("nnhost.storage")
T = TypeVar("T")

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
    """The blocking contract: every method may wait (disk, network) unless it says not.

    Call it from a thread or from synchronous code off the event loop; code on
    the loop uses `on_loop`.
    """

    @property
    def location(self) -> str:
        """Where results are kept, for logs and messages (a path, or s3://bucket/prefix)."""

    def check(self) -> None:
        """Raise `ResultStoreError` (with what to do) unless results can be written and read."""

    def staging_path(self, job_id: str) -> Path:
        """The local file a worker writes ``job_id``'s result into (a name: no I/O)."""

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
        its own links ignores it). A signature computed here: no I/O.
        """

    def delete(self, job_id: str) -> None:
        """Remove the stored result and any staged file (nothing there is not an error)."""

    def expire(self, before: float) -> int:
        """Remove results and staged files last written before ``before``; returns how many results."""

    def on_loop(self) -> AsyncResultStore:
        """This store as code on the event loop calls it."""


class AsyncResultStore(Protocol):
    """The result store as code on the event loop calls it: its I/O methods are coroutines.

    The methods that are not coroutines do no I/O. `store` is the blocking
    side, for the work `run_then` is given.
    """

    @property
    def store(self) -> ResultStore: ...

    @property
    def location(self) -> str: ...

    def staging_path(self, job_id: str) -> Path: ...

    def signed_url(self, job_id: str, ttl: float, base_url: str) -> str: ...

    async def commit(self, job_id: str) -> Optional[int]: ...

    async def write(self, job_id: str, data: bytes) -> int: ...

    async def open(self, job_id: str) -> BinaryIO:
        """The stored result; reading and closing it block too (run them with `run_blocking`)."""

    async def read(self, job_id: str) -> bytes: ...

    async def size(self, job_id: str) -> Optional[int]: ...

    async def exists(self, job_id: str) -> bool: ...

    async def delete(self, job_id: str) -> None: ...

    async def expire(self, before: float) -> int: ...

    def run_then(
        self, work: Callable[[ResultStore], T], then: Callable[[T], None]
    ) -> Optional[asyncio.Task[None]]:
        """Run the blocking ``work(store)`` where this store's I/O runs, then ``then(answer)`` here.

        In place (both done when it returns None), or in a thread: then the
        task that calls ``then`` on the loop once ``work`` is done, for the
        caller to keep or await. ``work`` should catch what it can handle; an
        error that escapes ``then`` is raised in place, or logged by the task.
        """


class LoopSide:
    """What both loop sides share: every I/O method is `call` of the blocking one.

    The two kinds below differ only in how a call runs (`call`) and in
    `run_then`; the method list is written once, here.
    """

    def __init__(self, store: ResultStore) -> None:
        self._store = store

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    @property
    def store(self) -> ResultStore:
        return self._store

    @property
    def location(self) -> str:
        return self._store.location

    def staging_path(self, job_id: str) -> Path:
        return self._store.staging_path(job_id)

    def signed_url(self, job_id: str, ttl: float, base_url: str) -> str:
        return self._store.signed_url(job_id, ttl, base_url)

    async def commit(self, job_id: str) -> Optional[int]:
        return await self.call(self._store.commit, job_id)

    async def write(self, job_id: str, data: bytes) -> int:
        return await self.call(self._store.write, job_id, data)

    async def open(self, job_id: str) -> BinaryIO:
        return await self.call(self._store.open, job_id)

    async def read(self, job_id: str) -> bytes:
        return await self.call(self._store.read, job_id)

    async def size(self, job_id: str) -> Optional[int]:
        return await self.call(self._store.size, job_id)

    async def exists(self, job_id: str) -> bool:
        return await self.call(self._store.exists, job_id)

    async def delete(self, job_id: str) -> None:
        await self.call(self._store.delete, job_id)

    async def expire(self, before: float) -> int:
        return await self.call(self._store.expire, before)


class InPlaceResults(LoopSide):
    """`AsyncResultStore` for a store whose calls return at once (a folder on this machine)."""

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        return function(*args)

    def run_then(
        self, work: Callable[[ResultStore], T], then: Callable[[T], None]
    ) -> Optional[asyncio.Task[None]]:
        then(work(self._store))
        return None


class ThreadedResults(LoopSide):
    """`AsyncResultStore` for a store whose calls wait on the network: each runs in a thread."""

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        return await run_blocking(function, *args)

    def run_then(
        self, work: Callable[[ResultStore], T], then: Callable[[T], None]
    ) -> Optional[asyncio.Task[None]]:
        async def run() -> None:
            try:
                then(await run_blocking(work, self._store))
            except Exception:
                log.exception("a call to the result store %s, or what follows it, failed", self.location)

        return asyncio.get_running_loop().create_task(run())


class DirectoryStore:
    """Results as files in one folder (local, or shared by every machine), served by this server.

    Its calls are a rename, a stat, an open or an unlink: on the event loop
    they run in place (`on_loop`).
    """

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

    def on_loop(self) -> AsyncResultStore:
        return InPlaceResults(self)

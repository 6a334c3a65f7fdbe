"""Where request payloads and result blobs live, and the signed links to results.

Payloads of jobs not yet finished are kept on disk so a restart loses nothing;
results are written by the worker itself straight into the result folder (the
API process never copies them) and downloaded by the client through a link
whose signature binds the job id and an expiry, so a link can be neither
guessed nor reused for another job or after it expires.

A directory today; an S3-compatible store can sit behind the same methods.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path
from typing import Optional


class BlobDir:
    """A folder of blobs named by job id."""

    def __init__(self, root: Path, suffix: str) -> None:
        self.root = root
        self.suffix = suffix
        root.mkdir(parents=True, exist_ok=True)

    def path(self, job_id: str) -> Path:
        if not job_id or not all(c.isalnum() or c in "-_" for c in job_id):
            raise ValueError(f"not a job id: {job_id!r}")
        return self.root / f"{job_id}{self.suffix}"

    def write(self, job_id: str, data: bytes) -> Path:
        path = self.path(job_id)
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
        return path

    def marker(self, job_id: str, name: str) -> Path:
        """A side file of a job's blob (e.g. ``started``)."""
        return self.path(job_id).with_name(f"{job_id}.{name}")

    def exists(self, job_id: str) -> bool:
        return self.path(job_id).is_file()

    def size(self, job_id: str) -> Optional[int]:
        try:
            return self.path(job_id).stat().st_size
        except OSError:
            return None

    def read(self, job_id: str) -> bytes:
        return self.path(job_id).read_bytes()

    def delete(self, job_id: str, *markers: str) -> None:
        for path in (self.path(job_id), *(self.marker(job_id, m) for m in markers)):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


class LinkSigner:
    """HMAC signatures over (job id, expiry) for result download links."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def from_file(cls, path: Path) -> "LinkSigner":
        """Load the server's signing secret, creating it (owner-only) on first use."""
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(secrets.token_bytes(32))
        return cls(path.read_bytes())

    def sign(self, job_id: str, expires: int) -> str:
        message = f"{job_id}:{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def query(self, job_id: str, ttl: float) -> str:
        expires = int(time.time() + ttl)
        return f"expires={expires}&sig={self.sign(job_id, expires)}"

    def verify(self, job_id: str, expires: int, signature: str) -> bool:
        if expires < time.time():
            return False
        return hmac.compare_digest(self.sign(job_id, expires), signature)

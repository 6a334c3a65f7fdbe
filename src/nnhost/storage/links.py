"""Signed links: HMAC over (job id, expiry), for results this server serves itself.

A link can be neither guessed nor reused for another job or after it expires,
so the download needs no API key (the nnsight client sends none). The secret
never leaves the data directory.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path


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

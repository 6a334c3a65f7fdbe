"""Web sessions: a random token in an HTTP-only cookie, its hash on the server.

The cookie holds a 256-bit random token; the database holds only its SHA-256,
so a copy of the database cannot be replayed as a login. A session ends when
it expires, when its user logs out, or when the user is disabled (checked on
every lookup). The CSRF token for a session's forms is derived from the
session token with HMAC, so it needs no storage, differs per session, and
cannot be computed by a page that can't read the cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from typing import Optional

from sqlalchemy import delete, insert, select

from ..db import Database
from ..db.tables import web_sessions
from .keys import KeyStore, Principal


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_token(secret: str, purpose: str = "session") -> str:
    """The token a form must echo back, bound to the cookie value ``secret``."""
    return hmac.new(secret.encode(), f"csrf:{purpose}".encode(), hashlib.sha256).hexdigest()


def csrf_matches(secret: Optional[str], sent: Optional[str], purpose: str = "session") -> bool:
    if not secret or not sent:
        return False
    return hmac.compare_digest(csrf_token(secret, purpose), sent)


class SessionStore:
    def __init__(self, database: Database, keys: KeyStore, ttl: float) -> None:
        self.database = database
        self._keys = keys
        self._lock = threading.Lock()
        self.ttl = ttl

    def create(self, user_id: int) -> str:
        """Start a session; returns the cookie value (the only time it exists in clear)."""
        token = secrets.token_urlsafe(32)
        now = time.time()
        with self._lock, self.database.write() as db:
            db.execute(
                insert(web_sessions).values(
                    hash=_digest(token), user_id=user_id, created_at=now, expires_at=now + self.ttl
                )
            )
            # Sweep ended sessions while we are writing anyway.
            db.execute(delete(web_sessions).where(web_sessions.c.expires_at <= now))
        return token

    def principal(self, token: Optional[str]) -> Optional[Principal]:
        """Who the cookie belongs to, or None (unknown, expired, or user disabled)."""
        if not token:
            return None
        query = select(web_sessions.c.user_id, web_sessions.c.expires_at).where(
            web_sessions.c.hash == _digest(token)
        )
        with self.database.read() as db:
            row = db.execute(query).mappings().first()
        if row is None or row["expires_at"] <= time.time():
            return None
        return self._keys.principal(row["user_id"])

    def end(self, token: Optional[str]) -> None:
        if not token:
            return
        with self._lock, self.database.write() as db:
            db.execute(delete(web_sessions).where(web_sessions.c.hash == _digest(token)))

    def end_all(self, user_id: int) -> None:
        with self._lock, self.database.write() as db:
            db.execute(delete(web_sessions).where(web_sessions.c.user_id == user_id))

"""Invite codes, for servers whose operator makes sign-up invite-only.

The operator makes codes with ``nnhost invites create`` and hands them out;
each code signs up one account (with the tags the operator gave it) and only
its hash is stored, like a key.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Optional

from .keys import normalize_tags

SCHEMA = """
CREATE TABLE IF NOT EXISTS invites (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    note TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    expires_at REAL,
    used_at REAL,
    used_by INTEGER REFERENCES users (id)
);
"""


@dataclass(frozen=True)
class Invite:
    id: int
    prefix: str
    tags: tuple[str, ...]
    note: str
    created_at: float
    expires_at: Optional[float]
    used_at: Optional[float]
    used_by: Optional[int]

    def state(self, now: Optional[float] = None) -> str:
        if self.used_at is not None:
            return "used"
        if self.expires_at is not None and self.expires_at <= (now or time.time()):
            return "expired"
        return "open"


def _digest(code: str) -> str:
    return hashlib.sha256(code.strip().encode()).hexdigest()


class InviteStore:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        self._lock = threading.Lock()
        self._db.executescript(SCHEMA)

    def create(
        self, tags: Iterable[str] = (), *, note: str = "", expires_at: Optional[float] = None
    ) -> str:
        code = "inv_" + secrets.token_urlsafe(18)
        with self._lock:
            self._db.execute(
                "INSERT INTO invites (hash, prefix, tags, note, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    _digest(code),
                    code[:10],
                    json.dumps(list(normalize_tags(tags))),
                    note,
                    time.time(),
                    expires_at,
                ),
            )
        return code

    def find(self, code: str) -> Optional[Invite]:
        row = self._db.execute("SELECT * FROM invites WHERE hash = ?", (_digest(code),)).fetchone()
        return _invite(row) if row else None

    def claim(self, code: str) -> Optional[Invite]:
        """Take an open invite for one sign-up (atomically), or None if it can't be used."""
        if not code or not code.strip():
            return None
        now = time.time()
        with self._lock:
            cursor = self._db.execute(
                "UPDATE invites SET used_at = ? WHERE hash = ? AND used_at IS NULL"
                " AND (expires_at IS NULL OR expires_at > ?)",
                (now, _digest(code), now),
            )
        return self.find(code) if cursor.rowcount else None

    def release(self, invite_id: int) -> None:
        """Give back a claimed invite whose sign-up did not go through."""
        with self._lock:
            self._db.execute(
                "UPDATE invites SET used_at = NULL WHERE id = ? AND used_by IS NULL", (invite_id,)
            )

    def bind(self, invite_id: int, user_id: int) -> None:
        with self._lock:
            self._db.execute("UPDATE invites SET used_by = ? WHERE id = ?", (user_id, invite_id))

    def all(self) -> list[Invite]:
        return [_invite(row) for row in self._db.execute("SELECT * FROM invites ORDER BY id")]


def _invite(row: sqlite3.Row) -> Invite:
    return Invite(
        id=row["id"],
        prefix=row["prefix"],
        tags=tuple(json.loads(row["tags"])),
        note=row["note"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        used_at=row["used_at"],
        used_by=row["used_by"],
    )

"""Users and their API keys, in the server's database.

A key is a long random secret shown once, when it is made; only its SHA-256
is stored (a key has 256 bits of entropy, so a fast hash is as good as a slow
one, and lookups stay O(1)). A short prefix is kept in clear so a person can
tell their keys apart. Keys can be revoked and can expire.

This module decides who a key belongs to; what that person may do is decided
by the callers (the API and the scheduler), from the user's tags.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    email TEXT NOT NULL UNIQUE,
    tags TEXT NOT NULL DEFAULT '[]',
    disabled INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id INTEGER NOT NULL REFERENCES users (id),
    prefix TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL,
    last_used_at REAL
);
"""

KEY_PREFIX = "nnh_"


@dataclass(frozen=True)
class Principal:
    """The user a request acts for."""

    user_id: int
    email: str
    tags: tuple[str, ...] = field(default_factory=tuple)


class KeyProblem(str, Enum):
    MISSING = "missing"
    UNKNOWN = "unknown"
    REVOKED = "revoked"
    EXPIRED = "expired"
    DISABLED = "disabled"


@dataclass(frozen=True)
class KeyCheck:
    principal: Optional[Principal] = None
    problem: Optional[KeyProblem] = None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyStore:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        self._lock = threading.Lock()
        self._db.executescript(SCHEMA)

    # -- users ---------------------------------------------------------------

    def user_count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM users").fetchone()[0]

    def add_user(self, email: str, tags: tuple[str, ...] = ()) -> int:
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO users (email, tags, created_at) VALUES (?, ?, ?)",
                (email, json.dumps(sorted(set(tags))), time.time()),
            )
            return int(cursor.lastrowid)

    def user_by_email(self, email: str) -> Optional[Principal]:
        row = self._db.execute("SELECT * FROM users WHERE email = ?", (email,)).fetchone()
        return _principal(row) if row else None

    # -- keys ----------------------------------------------------------------

    def create_key(
        self,
        user_id: int,
        *,
        name: str = "",
        expires_at: Optional[float] = None,
        key: Optional[str] = None,
    ) -> str:
        """Make a key for the user and return it; this is the only time it exists in clear."""
        key = key or new_key()
        with self._lock:
            self._db.execute(
                "INSERT INTO api_keys (user_id, prefix, hash, name, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (user_id, key[:12], hash_key(key), name, time.time(), expires_at),
            )
        return key

    def has_key(self, key: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM api_keys WHERE hash = ?", (hash_key(key),)
        ).fetchone()
        return row is not None

    def check(self, key: Optional[str]) -> KeyCheck:
        if not key:
            return KeyCheck(problem=KeyProblem.MISSING)
        row = self._db.execute(
            "SELECT k.id AS key_id, k.expires_at, k.revoked_at, u.* FROM api_keys k"
            " JOIN users u ON u.id = k.user_id WHERE k.hash = ?",
            (hash_key(key),),
        ).fetchone()
        if row is None:
            return KeyCheck(problem=KeyProblem.UNKNOWN)
        if row["revoked_at"] is not None:
            return KeyCheck(problem=KeyProblem.REVOKED)
        if row["expires_at"] is not None and row["expires_at"] <= time.time():
            return KeyCheck(problem=KeyProblem.EXPIRED)
        if row["disabled"]:
            return KeyCheck(problem=KeyProblem.DISABLED)
        return KeyCheck(principal=_principal(row))


def _principal(row: sqlite3.Row) -> Principal:
    return Principal(row["id"], row["email"], tuple(json.loads(row["tags"])))

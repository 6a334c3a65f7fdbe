"""Users and their API keys, in the server's database.

A key is a long random secret shown once, when it is made; only its SHA-256
is stored (a key has 256 bits of entropy, so a fast hash is as good as a slow
one, and lookups stay O(1)). A short prefix is kept in clear so a person can
tell their keys apart. Keys can be revoked and can expire; a user can be
disabled, which stops every key and web session they have at once.

A user may also have a password for the web pages; only its argon2 hash is
stored (see `passwords`). This module never sees a password in clear.

This module decides who a key belongs to; what that person may do is decided
by the callers (the API, the limits and the scheduler), from the user's tags.
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
from typing import Iterable, Optional

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    email TEXT NOT NULL UNIQUE,
    tags TEXT NOT NULL DEFAULT '[]',
    disabled INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    password_hash TEXT
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
CREATE INDEX IF NOT EXISTS api_keys_by_user ON api_keys (user_id);
"""

KEY_PREFIX = "nnh_"
#: The admin made on a server's first start (and the one everyone is with ``auth = "none"``).
LOCAL_ADMIN_EMAIL = "admin@localhost"
#: Characters of a key kept in clear, so people can tell their keys apart.
SHOWN_PREFIX = 12
#: Don't write `last_used_at` more often than this per key (one write per request is waste).
_LAST_USED_EVERY = 60.0


@dataclass(frozen=True)
class Principal:
    """The user a request acts for."""

    user_id: int
    email: str
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_admin(self) -> bool:
        return "admin" in self.tags


@dataclass(frozen=True)
class User:
    """A user as the operator sees one (never with the password hash)."""

    id: int
    email: str
    tags: tuple[str, ...]
    disabled: bool
    created_at: float
    has_password: bool


@dataclass(frozen=True)
class KeyInfo:
    """What may be shown about a key: never the key, never its hash."""

    id: int
    user_id: int
    email: str
    prefix: str
    name: str
    created_at: float
    expires_at: Optional[float]
    revoked_at: Optional[float]
    last_used_at: Optional[float]

    def state(self, now: Optional[float] = None) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= (now or time.time()):
            return "expired"
        return "active"


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


class UserExists(ValueError):
    """An account with that email is already there."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def normalize_email(email: str) -> str:
    return email.strip().lower()


def normalize_tags(tags: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({tag.strip().lower() for tag in tags if tag and tag.strip()}))


def _ensure_column(db: sqlite3.Connection, table: str, column: str, declaration: str) -> None:
    """Add a column a database made by an older nnhost lacks."""
    names = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    if column not in names:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")


class KeyStore:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        self._lock = threading.Lock()
        self._db.executescript(SCHEMA)
        _ensure_column(self._db, "users", "password_hash", "TEXT")

    # -- users ---------------------------------------------------------------

    def user_count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM users").fetchone()[0]

    def add_user(
        self, email: str, tags: Iterable[str] = (), *, password_hash: Optional[str] = None
    ) -> int:
        email = normalize_email(email)
        with self._lock:
            try:
                cursor = self._db.execute(
                    "INSERT INTO users (email, tags, created_at, password_hash)"
                    " VALUES (?, ?, ?, ?)",
                    (email, json.dumps(list(normalize_tags(tags))), time.time(), password_hash),
                )
            except sqlite3.IntegrityError:
                raise UserExists(f"There is already an account for {email}.") from None
            return int(cursor.lastrowid)

    def user_by_email(self, email: str) -> Optional[Principal]:
        row = self._db.execute(
            "SELECT * FROM users WHERE email = ?", (normalize_email(email),)
        ).fetchone()
        return _principal(row) if row else None

    def user(self, user_id: int) -> Optional[User]:
        row = self._db.execute("SELECT * FROM users WHERE id = ?", (user_id,)).fetchone()
        return _user(row) if row else None

    def find_user(self, email: str) -> Optional[User]:
        row = self._db.execute(
            "SELECT * FROM users WHERE email = ?", (normalize_email(email),)
        ).fetchone()
        return _user(row) if row else None

    def users(self) -> list[User]:
        return [_user(row) for row in self._db.execute("SELECT * FROM users ORDER BY id")]

    def set_disabled(self, user_id: int, disabled: bool) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE users SET disabled = ? WHERE id = ?", (int(disabled), user_id)
            )

    def set_tags(self, user_id: int, tags: Iterable[str]) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE users SET tags = ? WHERE id = ?",
                (json.dumps(list(normalize_tags(tags))), user_id),
            )

    def set_password_hash(self, user_id: int, password_hash: Optional[str]) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE users SET password_hash = ? WHERE id = ?", (password_hash, user_id)
            )

    def login_record(self, email: str) -> Optional[tuple[Principal, Optional[str], bool]]:
        """(who, their password hash, disabled) for a login attempt, or None."""
        row = self._db.execute(
            "SELECT * FROM users WHERE email = ?", (normalize_email(email),)
        ).fetchone()
        if row is None:
            return None
        return _principal(row), row["password_hash"], bool(row["disabled"])

    def principal(self, user_id: int) -> Optional[Principal]:
        """The user as a request acts for them, or None when unknown or disabled."""
        row = self._db.execute("SELECT * FROM users WHERE id = ?", (user_id,)).fetchone()
        if row is None or row["disabled"]:
            return None
        return _principal(row)

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
                (user_id, key[:SHOWN_PREFIX], hash_key(key), name, time.time(), expires_at),
            )
        return key

    def has_key(self, key: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM api_keys WHERE hash = ?", (hash_key(key),)
        ).fetchone()
        return row is not None

    def keys(self, user_id: Optional[int] = None) -> list[KeyInfo]:
        """Keys newest first: one user's, or everyone's."""
        query = (
            "SELECT k.*, u.email FROM api_keys k JOIN users u ON u.id = k.user_id"
            + (" WHERE k.user_id = ?" if user_id is not None else "")
            + " ORDER BY k.created_at DESC, k.id DESC"
        )
        rows = self._db.execute(query, (user_id,) if user_id is not None else ())
        return [_key_info(row) for row in rows]

    def find_keys(self, reference: str, user_id: Optional[int] = None) -> list[KeyInfo]:
        """Keys matching an id, or the start of a shown prefix (the key itself also works)."""
        reference = reference.strip().rstrip("…").rstrip(".")
        matches = []
        for info in self.keys(user_id):
            if reference.isdigit() and int(reference) == info.id:
                return [info]
            if len(reference) >= 6 and (
                info.prefix.startswith(reference) or reference.startswith(info.prefix)
            ):
                matches.append(info)
        if len(matches) > 1 and len(reference) > SHOWN_PREFIX:
            # The full key was given: only its hash can tell the candidates apart.
            digest = hash_key(reference)
            row = self._db.execute("SELECT id FROM api_keys WHERE hash = ?", (digest,)).fetchone()
            matches = [info for info in matches if row is not None and info.id == row["id"]]
        return matches

    def revoke_key(self, key_id: int, user_id: Optional[int] = None) -> bool:
        """Revoke a key (only the user's own, when ``user_id`` is given); False if none."""
        query = "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL"
        params: tuple = (time.time(), key_id)
        if user_id is not None:
            query += " AND user_id = ?"
            params += (user_id,)
        with self._lock:
            return self._db.execute(query, params).rowcount > 0

    def check(self, key: Optional[str]) -> KeyCheck:
        if not key:
            return KeyCheck(problem=KeyProblem.MISSING)
        row = self._db.execute(
            "SELECT k.id AS key_id, k.expires_at, k.revoked_at, k.last_used_at, u.*"
            " FROM api_keys k JOIN users u ON u.id = k.user_id WHERE k.hash = ?",
            (hash_key(key),),
        ).fetchone()
        if row is None:
            return KeyCheck(problem=KeyProblem.UNKNOWN)
        now = time.time()
        if row["revoked_at"] is not None:
            return KeyCheck(problem=KeyProblem.REVOKED)
        if row["expires_at"] is not None and row["expires_at"] <= now:
            return KeyCheck(problem=KeyProblem.EXPIRED)
        if row["disabled"]:
            return KeyCheck(problem=KeyProblem.DISABLED)
        if row["last_used_at"] is None or now - row["last_used_at"] > _LAST_USED_EVERY:
            with self._lock:
                self._db.execute(
                    "UPDATE api_keys SET last_used_at = ? WHERE id = ?", (now, row["key_id"])
                )
        return KeyCheck(principal=_principal(row))


def _principal(row: sqlite3.Row) -> Principal:
    return Principal(row["id"], row["email"], tuple(json.loads(row["tags"])))


def _user(row: sqlite3.Row) -> User:
    return User(
        id=row["id"],
        email=row["email"],
        tags=tuple(json.loads(row["tags"])),
        disabled=bool(row["disabled"]),
        created_at=row["created_at"],
        has_password=bool(row["password_hash"]),
    )


def _key_info(row: sqlite3.Row) -> KeyInfo:
    return KeyInfo(
        id=row["id"],
        user_id=row["user_id"],
        email=row["email"],
        prefix=row["prefix"],
        name=row["name"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        last_used_at=row["last_used_at"],
    )

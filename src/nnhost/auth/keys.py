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
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Optional

from sqlalchemy import Executable, Select, bindparam, func, insert, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import IntegrityError

from ..db import Database
from ..db.tables import api_keys, users

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


# Built once: every API request checks its key, and building the statement costs
# about as much as running it.
_CHECK = (
    select(
        api_keys.c.id.label("key_id"),
        api_keys.c.expires_at,
        api_keys.c.revoked_at,
        api_keys.c.last_used_at,
        users.c.id,
        users.c.email,
        users.c.tags,
        users.c.disabled,
    )
    .join(users, users.c.id == api_keys.c.user_id)
    .where(api_keys.c.hash == bindparam("hash"))
)
_USED = (
    update(api_keys)
    .where(api_keys.c.id == bindparam("key_id"))
    .values(last_used_at=bindparam("now"))
)


class KeyStore:
    def __init__(self, database: Database) -> None:
        self.database = database
        self._lock = threading.Lock()

    def _one(self, query: Select[Any]) -> Optional[RowMapping]:
        with self.database.read() as db:
            return db.execute(query).mappings().first()

    def _write(self, statement: Executable) -> int:
        """Run one statement in its own transaction; returns the rows it touched."""
        with self._lock, self.database.write() as db:
            return db.execute(statement).rowcount

    # -- users ---------------------------------------------------------------

    def user_count(self) -> int:
        with self.database.read() as db:
            return db.execute(select(func.count()).select_from(users)).scalar_one()

    def add_user(
        self, email: str, tags: Iterable[str] = (), *, password_hash: Optional[str] = None
    ) -> int:
        email = normalize_email(email)
        statement = insert(users).values(
            email=email,
            tags=json.dumps(list(normalize_tags(tags))),
            created_at=time.time(),
            password_hash=password_hash,
        )
        try:
            with self._lock, self.database.write() as db:
                key = db.execute(statement).inserted_primary_key
                assert key is not None  # an INSERT into a table with an integer key always has one
                return int(key[0])
        except IntegrityError:
            raise UserExists(f"There is already an account for {email}.") from None

    def user_by_email(self, email: str) -> Optional[Principal]:
        row = self._one(select(users).where(users.c.email == normalize_email(email)))
        return _principal(row) if row else None

    def user(self, user_id: int) -> Optional[User]:
        row = self._one(select(users).where(users.c.id == user_id))
        return _user(row) if row else None

    def find_user(self, email: str) -> Optional[User]:
        row = self._one(select(users).where(users.c.email == normalize_email(email)))
        return _user(row) if row else None

    def users(self) -> list[User]:
        with self.database.read() as db:
            return [_user(row) for row in db.execute(select(users).order_by(users.c.id)).mappings()]

    def set_disabled(self, user_id: int, disabled: bool) -> None:
        self._write(update(users).where(users.c.id == user_id).values(disabled=int(disabled)))

    def set_tags(self, user_id: int, tags: Iterable[str]) -> None:
        self._write(
            update(users)
            .where(users.c.id == user_id)
            .values(tags=json.dumps(list(normalize_tags(tags))))
        )

    def set_password_hash(self, user_id: int, password_hash: Optional[str]) -> None:
        self._write(update(users).where(users.c.id == user_id).values(password_hash=password_hash))

    def login_record(self, email: str) -> Optional[tuple[Principal, Optional[str], bool]]:
        """(who, their password hash, disabled) for a login attempt, or None."""
        row = self._one(select(users).where(users.c.email == normalize_email(email)))
        if row is None:
            return None
        return _principal(row), row["password_hash"], bool(row["disabled"])

    def principal(self, user_id: int) -> Optional[Principal]:
        """The user as a request acts for them, or None when unknown or disabled."""
        row = self._one(select(users).where(users.c.id == user_id))
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
        self._write(
            insert(api_keys).values(
                user_id=user_id,
                prefix=key[:SHOWN_PREFIX],
                hash=hash_key(key),
                name=name,
                created_at=time.time(),
                expires_at=expires_at,
            )
        )
        return key

    def has_key(self, key: str) -> bool:
        return self._one(select(api_keys.c.id).where(api_keys.c.hash == hash_key(key))) is not None

    def keys(self, user_id: Optional[int] = None) -> list[KeyInfo]:
        """Keys newest first: one user's, or everyone's."""
        query = select(api_keys, users.c.email).join(users, users.c.id == api_keys.c.user_id)
        if user_id is not None:
            query = query.where(api_keys.c.user_id == user_id)
        query = query.order_by(api_keys.c.created_at.desc(), api_keys.c.id.desc())
        with self.database.read() as db:
            return [_key_info(row) for row in db.execute(query).mappings()]

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
            row = self._one(select(api_keys.c.id).where(api_keys.c.hash == hash_key(reference)))
            matches = [info for info in matches if row is not None and info.id == row["id"]]
        return matches

    def revoke_key(self, key_id: int, user_id: Optional[int] = None) -> bool:
        """Revoke a key (only the user's own, when ``user_id`` is given); False if none."""
        statement = (
            update(api_keys)
            .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
            .values(revoked_at=time.time())
        )
        if user_id is not None:
            statement = statement.where(api_keys.c.user_id == user_id)
        return self._write(statement) > 0

    def check(self, key: Optional[str]) -> KeyCheck:
        if not key:
            return KeyCheck(problem=KeyProblem.MISSING)
        with self.database.read() as db:
            row = db.execute(_CHECK, {"hash": hash_key(key)}).mappings().first()
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
            with self._lock, self.database.write() as db:
                db.execute(_USED, {"key_id": row["key_id"], "now": now})
        return KeyCheck(principal=_principal(row))


def _principal(row: RowMapping) -> Principal:
    return Principal(row["id"], row["email"], tuple(json.loads(row["tags"])))


def _user(row: RowMapping) -> User:
    return User(
        id=row["id"],
        email=row["email"],
        tags=tuple(json.loads(row["tags"])),
        disabled=bool(row["disabled"]),
        created_at=row["created_at"],
        has_password=bool(row["password_hash"]),
    )


def _key_info(row: RowMapping) -> KeyInfo:
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

"""Invite codes, for servers whose operator makes sign-up invite-only.

The operator makes codes with ``nnhost invites create`` and hands them out;
each code signs up one account (with the tags the operator gave it) and only
its hash is stored, like a key.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Optional

from sqlalchemy import Executable, insert, select, update
from sqlalchemy.engine import RowMapping

from ..db import Database
from ..db.tables import invites
from .keys import normalize_tags


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
    def __init__(self, database: Database) -> None:
        self.database = database
        self._lock = threading.Lock()

    def _write(self, statement: Executable) -> int:
        with self._lock, self.database.write() as db:
            return db.execute(statement).rowcount

    def create(
        self, tags: Iterable[str] = (), *, note: str = "", expires_at: Optional[float] = None
    ) -> str:
        code = "inv_" + secrets.token_urlsafe(18)
        self._write(
            insert(invites).values(
                hash=_digest(code),
                prefix=code[:10],
                tags=json.dumps(list(normalize_tags(tags))),
                note=note,
                created_at=time.time(),
                expires_at=expires_at,
            )
        )
        return code

    def find(self, code: str) -> Optional[Invite]:
        with self.database.read() as db:
            row = db.execute(select(invites).where(invites.c.hash == _digest(code))).mappings().first()
        return _invite(row) if row else None

    def claim(self, code: str) -> Optional[Invite]:
        """Take an open invite for one sign-up (atomically), or None if it can't be used."""
        if not code or not code.strip():
            return None
        now = time.time()
        claimed = self._write(
            update(invites)
            .where(
                invites.c.hash == _digest(code),
                invites.c.used_at.is_(None),
                (invites.c.expires_at.is_(None)) | (invites.c.expires_at > now),
            )
            .values(used_at=now)
        )
        return self.find(code) if claimed else None

    def release(self, invite_id: int) -> None:
        """Give back a claimed invite whose sign-up did not go through."""
        self._write(
            update(invites)
            .where(invites.c.id == invite_id, invites.c.used_by.is_(None))
            .values(used_at=None)
        )

    def bind(self, invite_id: int, user_id: int) -> None:
        self._write(update(invites).where(invites.c.id == invite_id).values(used_by=user_id))

    def all(self) -> list[Invite]:
        with self.database.read() as db:
            return [_invite(row) for row in db.execute(select(invites).order_by(invites.c.id)).mappings()]


def _invite(row: RowMapping) -> Invite:
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

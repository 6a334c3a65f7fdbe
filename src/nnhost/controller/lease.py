"""Which process is the controller: a lease in the shared database.

Exactly one controller may act at a time (it owns the fair queue and the
replicas; two would dispatch a job twice). Every controller started against
one database tries to take the ``controller`` lease; the one that holds it
renews it every `RENEW_EVERY` seconds, the others wait and try again. A
holder that dies stops renewing, and its lease expires `TTL` seconds after its
last renewal: a waiting controller then takes it, so a standby takes over
within seconds, on any database (a row, not a database's own lock, so it works
the same on SQLite and PostgreSQL and across machines).

A holder that fails to renew in time must stop acting at once (`renew`
returns False): another controller may already have taken over. It knows
nothing of jobs.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Optional

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from ..db import Database
from ..db.tables import leases

#: Seconds a lease lasts after its last renewal.
TTL = 6.0
#: Seconds between renewals (several per lifetime, so one slow write is not fatal).
RENEW_EVERY = 1.0


@dataclass(frozen=True)
class Holder:
    holder: str
    acquired_at: float
    expires_at: float


def holder_name() -> str:
    """This process, recognisably: host, pid and a random part (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    def __init__(self, database: Database, name: str = "controller", ttl: float = TTL,
                 holder: Optional[str] = None) -> None:
        self.database = database
        self.name = name
        self.ttl = ttl
        self.holder = holder or holder_name()

    def current(self) -> Optional[Holder]:
        query = select(leases).where(leases.c.name == self.name)
        with self.database.read() as db:
            row = db.execute(query).mappings().first()
        if row is None:
            return None
        return Holder(row["holder"], row["acquired_at"], row["expires_at"])

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it or its holder let it expire."""
        now = time.time()
        try:
            with self.database.write() as db:
                query = select(leases).where(leases.c.name == self.name).with_for_update()
                row = db.execute(query).mappings().first()
                if row is None:
                    db.execute(insert(leases).values(
                        name=self.name, holder=self.holder, acquired_at=now, expires_at=now + self.ttl
                    ))
                    return True
                if row["holder"] != self.holder and row["expires_at"] > now:
                    return False
                db.execute(
                    update(leases).where(leases.c.name == self.name)
                    .values(holder=self.holder, acquired_at=now, expires_at=now + self.ttl)
                )
                return True
        except IntegrityError:
            return False  # another process inserted the first row at the same moment

    def renew(self) -> bool:
        """Extend the lease; False if this process no longer holds it (stop acting)."""
        now = time.time()
        with self.database.write() as db:
            result = db.execute(
                update(leases)
                .where(leases.c.name == self.name, leases.c.holder == self.holder,
                       leases.c.expires_at > now)
                .values(expires_at=now + self.ttl)
            )
            return result.rowcount == 1

    def release(self) -> None:
        """Give the lease up at a clean stop, so a standby need not wait for it to expire."""
        with self.database.write() as db:
            db.execute(delete(leases).where(leases.c.name == self.name,
                                            leases.c.holder == self.holder))

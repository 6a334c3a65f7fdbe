"""Named values every process of one deployment shares (``shared_values``).

A secret made by the first process that needs it (the result-link signing
key) must be the same in every API process, wherever it runs; the first
writer wins and every later reader gets its value.
"""

from __future__ import annotations

import time
from typing import Callable

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from .engine import Database
from .tables import shared_values


def get_or_create(database: Database, name: str, make: Callable[[], str]) -> str:
    query = select(shared_values.c.value).where(shared_values.c.name == name)
    with database.read() as db:
        value: str | None = db.execute(query).scalar()
    if value is not None:
        return value
    try:
        with database.write() as db:
            db.execute(insert(shared_values).values(name=name, value=make(), updated_at=time.time()))
    except IntegrityError:
        pass  # another process made it first: use theirs
    with database.read() as db:
        made: str = db.execute(query).scalar_one()
        return made

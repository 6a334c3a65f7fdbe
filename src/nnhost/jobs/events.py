"""Fan-out of job updates to the websocket sessions waiting for them.

A blocking client opens ``/subscribe`` first and gets a session id; each job it
then submits names that session, and every update for the job is put on the
session's queue, which the websocket handler drains. A session belongs to the
user who opened it, so updates only ever reach their owner.

In-process today (one API process); the same two calls can sit on Redis
pub/sub when there are several API processes.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Optional, Union

#: What the websocket sends: JSON text, or pickled bytes for a binary frame.
Frame = Union[str, bytes]


@dataclass
class Session:
    id: str
    user_id: Optional[int]
    queue: "asyncio.Queue[Frame]" = field(default_factory=asyncio.Queue)


class EventBus:
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}

    def open(self, user_id: Optional[int]) -> Session:
        session = Session(secrets.token_urlsafe(16), user_id)
        self._sessions[session.id] = session
        return session

    def close(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def owner(self, session_id: str) -> Optional[Session]:
        return self._sessions.get(session_id)

    def publish(self, session_id: str, frame: Frame) -> bool:
        """Queue ``frame`` for the session; False if nobody is listening."""
        session = self._sessions.get(session_id)
        if session is None:
            return False
        session.queue.put_nowait(frame)
        return True

    def __len__(self) -> int:
        return len(self._sessions)

"""Fan-out of job updates to the websocket sessions waiting for them.

A blocking client opens ``/subscribe`` first and gets a session id; each job it
then submits names that session, and every update for the job is published to
it, in order, until the websocket closes. A session belongs to the user who
opened it, so updates only ever reach their owner.

`EventBus` is the contract the job service and the websocket route program
against. `LocalEventBus` keeps everything in this process (one API process,
the default); `bus_redis.RedisEventBus` carries the same calls over Redis, so
an update published by whichever process runs the job reaches the websocket
on whichever API process holds it. ``publish`` never blocks and never fails
the caller: an update for a session nobody holds is dropped, as it would be
with a closed websocket.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Optional, Protocol, Union

#: What the websocket sends: JSON text, or pickled bytes for a binary frame.
Frame = Union[str, bytes]


@dataclass
class Session:
    id: str
    user_id: Optional[int]
    #: A session whose client cannot name its key when it opens it (Socket.IO, nnsight
    #: before 0.8): any request that knows its id may name it, the id being a secret
    #: only its connection was told.
    anyone: bool = False
    #: Updates delivered to this process for this session, in order.
    queue: "asyncio.Queue[Frame]" = field(default_factory=asyncio.Queue)

    async def next(self) -> Frame:
        return await self.queue.get()


def new_session_id() -> str:
    return secrets.token_urlsafe(16)


class EventBus(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def open(self, user_id: Optional[int], session_id: str = "", anyone: bool = False) -> Session:
        """A new session of ``user_id``'s (named ``session_id``, or a fresh id), ready to receive
        once this returns; ``anyone``: see `Session.anyone`."""

    async def close(self, session_id: str) -> None: ...

    async def owner(self, session_id: str) -> Optional[Session]:
        """The open session ``session_id`` (for its ``user_id``), wherever it is held."""

    def publish(self, session_id: str, frame: Frame) -> None:
        """Queue ``frame`` for the session, after every frame published to it before."""

    async def listen(self, name: str) -> Session:
        """Receive what is published to ``name`` from any process (the controller's wake-up
        call). Not a user's session: `owner` never returns it, so no job can name it."""

    def __len__(self) -> int:
        """Sessions held by this process."""


class LocalEventBus:
    """Every session in this process."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._listeners: dict[str, Session] = {}

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self._sessions.clear()

    async def open(self, user_id: Optional[int], session_id: str = "", anyone: bool = False) -> Session:
        session = Session(session_id or new_session_id(), user_id, anyone)
        self._sessions[session.id] = session
        return session

    async def close(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    async def owner(self, session_id: str) -> Optional[Session]:
        return self._sessions.get(session_id)

    def publish(self, session_id: str, frame: Frame) -> None:
        session = self._sessions.get(session_id) or self._listeners.get(session_id)
        if session is not None:
            session.queue.put_nowait(frame)

    async def listen(self, name: str) -> Session:
        listener = self._listeners[name] = Session(name, None)
        return listener

    def __len__(self) -> int:
        return len(self._sessions)

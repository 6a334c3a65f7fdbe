"""The event bus over Redis: sessions held by one process, updates published by any.

Each session has a channel (``PREFIX:session:ID``) and an owner record
(``PREFIX:owner:ID``, the user id, with a lifetime refreshed while the session
is open). The process holding a session's websocket subscribes to its channel
before `open` returns, so nothing published after the client learnt its
session id can be missed. One pub/sub connection per process carries every
session it holds; one writer task publishes in the order ``publish`` was
called, so a job's updates arrive in order. A session held by this process is
served without the round trip.

Frames are tagged on the wire (``t`` text, ``b`` bytes) so a pickled result
frame stays a binary websocket frame. What arrives from Redis is checked
(known channel, known tag; an owner record is a `SessionOwner`) and anything
else dropped: the bus must never raise into the job service or a websocket.
It knows nothing of HTTP, nor of what a frame says (`update.JobUpdate`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Optional

import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, ValidationError
from redis.asyncio.client import PubSub

from .bus import Frame, Session, new_session_id

log = logging.getLogger("nnhost.bus")

#: Seconds an owner record outlives its last refresh (a process that died leaves none for long).
OWNER_TTL = 3600
REFRESH_EVERY = OWNER_TTL / 3


class BusUnavailable(RuntimeError):
    """Redis could not be reached (at start)."""


class SessionOwner(BaseModel):
    """A session's owner record (``PREFIX:owner:ID``): whose session it is, for any process."""

    # Strict and closed: the record is read back from Redis, where any process
    # (or anyone with access to it) may have written it; a user id is never coerced.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    user_id: Optional[int]
    anyone: bool = False


def encode(frame: Frame) -> bytes:
    return b"b" + frame if isinstance(frame, bytes) else b"t" + frame.encode("utf-8")


def decode(data: bytes) -> Optional[Frame]:
    if data[:1] == b"b":
        return data[1:]
    if data[:1] == b"t":
        return data[1:].decode("utf-8", "replace")
    return None


class RedisEventBus:
    def __init__(self, url: str, prefix: str = "nnhost") -> None:
        self.url = url
        self.prefix = prefix
        self._redis = aioredis.from_url(url)
        self._pubsub: Optional[PubSub] = None
        self._sessions: dict[str, Session] = {}
        self._listeners: dict[str, Session] = {}
        self._confirmed: dict[str, asyncio.Future[bool]] = {}
        self._outgoing: "asyncio.Queue[tuple[str, bytes]]" = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        #: A channel of this process's own, so the reader always has a subscription.
        self._home = f"{prefix}:bus:{secrets.token_hex(8)}"

    def _channel(self, session_id: str) -> str:
        return f"{self.prefix}:session:{session_id}"

    def _owner_key(self, session_id: str) -> str:
        return f"{self.prefix}:owner:{session_id}"

    def _subscriptions(self) -> PubSub:
        """The pub/sub connection, which `start` opens: nothing is subscribed before it."""
        if self._pubsub is None:
            raise RuntimeError("the Redis event bus is not started")
        return self._pubsub

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._redis.ping()
        except Exception as error:
            raise BusUnavailable(f"cannot reach Redis at {self.url}: {error}") from error
        self._pubsub = self._redis.pubsub()
        await self._subscribe(self._home)
        self._tasks = [
            asyncio.create_task(self._read(), name="bus-read"),
            asyncio.create_task(self._write(), name="bus-write"),
            asyncio.create_task(self._refresh(), name="bus-refresh"),
        ]
        await self._confirmation(self._home)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for session_id in list(self._sessions):
            await self._redis.delete(self._owner_key(session_id))
        self._sessions.clear()
        if self._pubsub is not None:
            # redis-py before 8.2 leaves PubSub.aclose unannotated; later ones type it.
            await self._pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
        await self._redis.aclose()

    # -- sessions ----------------------------------------------------------------------

    async def open(self, user_id: Optional[int], session_id: str = "", anyone: bool = False) -> Session:
        session = Session(session_id or new_session_id(), user_id, anyone)
        self._sessions[session.id] = session
        await self._redis.set(self._owner_key(session.id),
                              SessionOwner(user_id=user_id, anyone=anyone).model_dump_json(), ex=OWNER_TTL)
        channel = self._channel(session.id)
        await self._subscribe(channel)
        await self._confirmation(channel)
        return session

    async def close(self, session_id: str) -> None:
        if self._sessions.pop(session_id, None) is None:
            return
        await self._redis.delete(self._owner_key(session_id))
        await self._subscriptions().unsubscribe(self._channel(session_id))

    async def owner(self, session_id: str) -> Optional[Session]:
        local = self._sessions.get(session_id)
        if local is not None:
            return local
        raw = await self._redis.get(self._owner_key(session_id))
        if raw is None:
            return None
        try:
            record = SessionOwner.model_validate_json(raw)
        except ValidationError:
            log.warning("the owner record of session %s is malformed; the session is refused",
                        session_id)
            return None
        return Session(session_id, record.user_id, record.anyone)

    async def listen(self, name: str) -> Session:
        listener = self._listeners[name] = Session(name, None)
        channel = self._channel(name)
        await self._subscribe(channel)
        await self._confirmation(channel)
        return listener

    def publish(self, session_id: str, frame: Frame) -> None:
        local = self._sessions.get(session_id) or self._listeners.get(session_id)
        if local is not None:
            local.queue.put_nowait(frame)
        else:
            self._outgoing.put_nowait((self._channel(session_id), encode(frame)))

    def __len__(self) -> int:
        return len(self._sessions)

    # -- the connection's tasks ----------------------------------------------------------

    async def _subscribe(self, channel: str) -> None:
        self._confirmed[channel] = asyncio.get_running_loop().create_future()
        await self._subscriptions().subscribe(channel)

    async def _confirmation(self, channel: str) -> None:
        """Wait until Redis says the subscription to ``channel`` is in place."""
        try:
            await asyncio.wait_for(self._confirmed[channel], 10)
        finally:
            self._confirmed.pop(channel, None)

    async def _read(self) -> None:
        prefix = f"{self.prefix}:session:"
        while True:
            try:
                message = await self._subscriptions().get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reading from Redis failed; retrying")
                await asyncio.sleep(1)
                continue
            if message is None:
                continue
            channel = message.get("channel")
            channel = channel.decode("utf-8", "replace") if isinstance(channel, bytes) else str(channel)
            if message.get("type") == "subscribe":
                waiter = self._confirmed.get(channel)
                if waiter is not None and not waiter.done():
                    waiter.set_result(True)
                continue
            if message.get("type") != "message" or not channel.startswith(prefix):
                continue
            name = channel[len(prefix):]
            session = self._sessions.get(name) or self._listeners.get(name)
            data = message.get("data")
            frame = decode(data) if isinstance(data, bytes) else None
            if session is not None and frame is not None:
                session.queue.put_nowait(frame)

    async def _write(self) -> None:
        while True:
            channel, payload = await self._outgoing.get()
            try:
                await self._redis.publish(channel, payload)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("publishing to Redis failed; the update for %s is lost", channel)

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_EVERY)
            for session_id in list(self._sessions):
                try:
                    await self._redis.expire(self._owner_key(session_id), OWNER_TTL)
                except Exception:
                    log.exception("could not refresh session %s", session_id)

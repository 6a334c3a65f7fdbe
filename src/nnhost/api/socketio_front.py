"""The Socket.IO sessions of nnsight clients before 0.8: where their jobs' updates go.

Why it exists: nnsight 0.6 and 0.7 first connect a Socket.IO session at
``/ws/socket.io`` (websocket transport only), then POST ``/request`` naming
the session in its ``ndif-session_id`` header, and wait on the session for
every update of their job (`legacy`). A server without it leaves them at
``socketio.exceptions.ConnectionError: Connection error``.

Each Socket.IO session is an event-bus session under the same id
(`jobs.bus`), opened as the client connects and closed as it leaves, so an
update published by whichever process runs the job reaches the process
holding the connection, as a 0.8 client's ``/subscribe`` does. The client
cannot name its key when it connects, so the session is open to any request
that knows its id (`jobs.bus.Session.anyone`); the key is checked on the
request. A version this server does not serve still connects, and reads the
refusal on its POST.

It never reads what a client sends on the session (no event has a
handler) and never runs anything. Each session is a websocket the doorman
(`api.connections`) counts like any other.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import socketio  # type: ignore[import-untyped]
from starlette.datastructures import State
from starlette.types import ASGIApp, Receive, Scope, Send

from ..storage.blocking import run_blocking
from . import legacy, replies

if TYPE_CHECKING:
    from .server import Server

#: Where the clients look for it (their ``socketio_path``), without the leading slash.
SOCKETIO_PATH = "ws/socket.io"


class SocketIOFront:
    """ASGI middleware: ``/ws/socket.io/`` goes to the Socket.IO server, everything else to ``app``."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self._state = state
        self._sio = socketio.AsyncServer(
            async_mode="asgi",
            # The clients ask for the websocket transport; long-polling would hold
            # sessions that no connection counts.
            transports=["websocket"],
            max_http_buffer_size=64 * 1024,
            logger=False,
            engineio_logger=False,
        )
        self._forwarders: dict[str, asyncio.Task[None]] = {}
        self._sio.on("connect", self._connect)
        self._sio.on("disconnect", self._disconnect)
        self._app: Any = socketio.ASGIApp(self._sio, other_asgi_app=app, socketio_path=SOCKETIO_PATH)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    async def _connect(self, sid: str, environ: Any, auth: Any = None) -> None:
        server: Server = self._state.server
        session = await server.bus.open(None, session_id=sid, anyone=True)
        self._forwarders[sid] = asyncio.create_task(self._forward(server, sid, session.next),
                                                    name="socketio-forward")

    async def _disconnect(self, sid: str, *args: Any) -> None:
        task = self._forwarders.pop(sid, None)
        if task is not None:
            task.cancel()
        await self._state.server.bus.close(sid)

    async def _forward(self, server: Server, sid: str, next_frame: Any) -> None:
        """Every update published to the session, in order, as the client's events."""
        while True:
            update = replies.published_update(await next_frame())
            if update is None:
                continue
            # In a thread: the first one imports torch, for its file format.
            data = await run_blocking(legacy.update_event, server, update)
            await self._sio.emit(legacy.EVENT, data, to=sid)

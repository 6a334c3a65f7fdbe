"""The Socket.IO session that nnsight clients before 0.8 open before they send a request.

Why it exists: nnsight 0.5 to 0.7 first connect a Socket.IO session at
``/ws/socket.io`` (websocket transport only), and only then POST
``/request``, naming the session in its ``ndif-session_id`` header. A server
without the session leaves them at ``socketio.exceptions.ConnectionError:
Connection error``, with no word of why. With it served, such a client
reaches its POST and reads the server's answer there, in its own client:
the refusal naming the client versions served (`api.deps.check_client_version`)
when its version is not among them.

It never reads what a session sends (no event has a handler) and never
runs anything. Sessions are anonymous, as ``/subscribe`` is, and each is a
websocket the doorman (`api.connections`) counts like any other.
"""

from __future__ import annotations

from typing import Any

import socketio  # type: ignore[import-untyped]
from starlette.types import ASGIApp, Receive, Scope, Send

#: Where the clients look for it (their ``socketio_path``), without the leading slash.
SOCKETIO_PATH = "ws/socket.io"


class SocketIOFront:
    """ASGI middleware: ``/ws/socket.io/`` goes to the Socket.IO server, everything else to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        server = socketio.AsyncServer(
            async_mode="asgi",
            # The clients ask for the websocket transport; long-polling would hold
            # sessions that no connection counts.
            transports=["websocket"],
            max_http_buffer_size=64 * 1024,
            logger=False,
            engineio_logger=False,
        )
        self._app: Any = socketio.ASGIApp(server, other_asgi_app=app, socketio_path=SOCKETIO_PATH)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

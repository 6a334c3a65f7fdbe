"""Every HTTP response gets a request id, and is counted.

The id is the caller's ``x-request-id`` when it sent a sane one (printable
ASCII, at most 128 characters: a proxy's or a load balancer's), else a new
one; it is echoed on the response, including websocket handshakes' refusals,
and set in `telemetry.logs.request_id` so every log line written while the
request is handled carries it. Responses are counted by method, route
template (never the raw path, which holds job ids; static files and
unknown paths are "other") and status code.

A plain ASGI middleware rather than Starlette's `BaseHTTPMiddleware`, so
streamed results and websockets pass through untouched.
"""

from __future__ import annotations

import re
import uuid
from typing import Callable, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..telemetry.logs import request_id

HEADER = b"x-request-id"
_SANE = re.compile(r"[\x21-\x7e]{1,128}")


def _incoming(scope: Scope) -> Optional[str]:
    for name, value in scope.get("headers", ()):
        if name == HEADER:
            text = value.decode("latin-1")
            return text if _SANE.fullmatch(text) else None
    return None


class RequestIds:
    def __init__(
        self, app: ASGIApp, count: Optional[Callable[[str, str, str], None]] = None
    ) -> None:
        self.app = app
        #: Called with (method, route, code) once per HTTP response.
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        rid = _incoming(scope) or uuid.uuid4().hex
        token = request_id.set(rid)
        code = {"value": 500}

        async def send_with_id(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.http.response.start",
                                   "websocket.accept"):
                code["value"] = message.get("status", 101)
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, rid.encode("latin-1"))]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)
            if scope["type"] == "http" and self.count is not None:
                route = scope.get("route")
                template = getattr(route, "path", None) or "other"  # static files, 404s
                self.count(scope.get("method", ""), template, str(code["value"]))

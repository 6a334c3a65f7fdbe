"""uvicorn's protocols with the API's guards on each connection: bounded heads, deadlines, a doorman.

Why it exists: uvicorn holds a connection that never finishes its request
for as long as the client likes, and a request head of any length. An
anonymous client could grow the process without end, or hold every
descriptor with idle and half-sent requests so that no one else is answered
(tests/test_hostile_traffic.py). Around uvicorn's httptools protocol this
adds, per connection:

- a bound on the head's size as it arrives (`MAX_REQUEST_HEAD`): past it,
  400 and close, as h11 did. httptools (llhttp, in C) stays because it
  parses several times cheaper than h11, which a loop of small traces pays
  on every POST and websocket handshake (about 4 ms of a small trace's
  median on two cores). The count is of whole reads: a read that finishes
  one request's body and starts the next (pipelining) counts whole towards
  the next head, so the bound may trip early by at most one read;
- a deadline for the head (408 and close) and one for the body (close);
- admission by the `connections.Doorman`: a newcomer past the ceiling or
  its address's cap closes the connection that has waited longest for a
  head, or is told 503 when every connection is in use.

A websocket keeps its door until it closes (`guarded_protocols` gives the
websocket protocol the same doorman). This module never looks into a body,
and never closes a connection whose request is being answered.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Optional, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

from .connections import Door, Doorman, Refused, peer_address

#: Largest request head (request line and headers) the server reads.
MAX_REQUEST_HEAD = 64 * 1024


class GuardedHttp(HttpToolsProtocol):
    doorman: ClassVar[Doorman]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._in_head = True
        self._door: Optional[Door] = None
        self._deadline: Optional[asyncio.TimerHandle] = None

    # -- the connection's life -------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        try:
            self._door = self.doorman.admit(peer_address(self.client), self)
        except Refused as refused:
            self._answer(503, str(refused), retry_after=1)
            return
        self._await_head()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel_deadline()
        if self._door is not None:
            self.doorman.gone(self._door)
        super().connection_lost(exc)

    def evict(self) -> None:
        """The doorman's word: this connection, waiting longest, gives way to a newcomer."""
        self._cancel_deadline()
        if not self.transport.is_closing():
            self.transport.close()

    def handle_websocket_upgrade(self) -> None:
        self._cancel_deadline()
        door, self._door = self._door, None
        super().handle_websocket_upgrade()
        upgraded = self.transport.get_protocol()
        if door is not None:
            if isinstance(upgraded, GuardedWebSocket):
                upgraded.door = door  # it tells the doorman when the websocket closes
            else:
                self.doorman.gone(door)

    # -- a request's phases ------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._in_head = True

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_deadline()
        if self._door is not None:
            self.doorman.busy(self._door)
        super().on_headers_complete()
        if not (self.parser.should_upgrade() and self._should_upgrade()):
            limit = self.doorman.limits.body_timeout
            self._deadline = self.loop.call_later(limit, self._body_overdue)

    def on_message_complete(self) -> None:
        self._cancel_deadline()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._cancel_deadline()
        super().on_response_complete()
        # uvicorn arms its keep-alive timer when the connection waits for the
        # next request; with a pipelined request to run instead, it does not.
        if self.timeout_keep_alive_task is not None:
            self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_REQUEST_HEAD:
            self._in_head = False
            self.send_400_response(
                f"Request head too large: more than {MAX_REQUEST_HEAD} bytes of request line and headers."
            )

    # -- deadlines ----------------------------------------------------------------------

    def _await_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        if self._door is not None:
            self.doorman.waiting(self._door)
        self._cancel_deadline()
        self._deadline = self.loop.call_later(self.doorman.limits.head_timeout, self._head_overdue)

    def _head_overdue(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            limit = self.doorman.limits.head_timeout
            self._answer(408, f"The request's head did not arrive within {limit:g} seconds.")

    def _body_overdue(self) -> None:
        # The app may be reading the body: no answer can be written beside
        # its own, so the connection is closed and the app sees a disconnect.
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _answer(self, status: int, text: str, retry_after: Optional[int] = None) -> None:
        """A plain-text answer and a close, written while no request of this connection is served."""
        body = text.encode("utf-8")
        phrase = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        head = [b"HTTP/1.1 %d %s\r\n" % (status, phrase)]
        head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
        if retry_after is not None:
            head.append(b"retry-after: %d\r\n" % retry_after)
        head.append(b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" % len(body))
        self.transport.write(b"".join(head) + b"connection: close\r\n\r\n" + body)
        self.transport.close()


class GuardedWebSocket(cast(Any, AutoWebSocketsProtocol)):  # type: ignore[misc]
    """uvicorn's websocket protocol, which gives its connection's door back when it closes."""

    doorman: ClassVar[Doorman]
    door: Optional[Door] = None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.door is not None:
            self.doorman.gone(self.door)
            self.door = None
        super().connection_lost(exc)


def guarded_protocols(doorman: Doorman) -> tuple[type[GuardedHttp], type[GuardedWebSocket]]:
    """The HTTP and websocket protocol classes of one server, both answering to ``doorman``."""
    http = type("GuardedHttp", (GuardedHttp,), {"doorman": doorman})
    websocket = type("GuardedWebSocket", (GuardedWebSocket,), {"doorman": doorman})
    return http, websocket

"""uvicorn's httptools protocol, with each request's head bounded as it arrives.

Why it exists: httptools (llhttp, in C) parses a request several times
cheaper than h11 (in Python), and a user's loop of small traces pays it on
every POST and websocket handshake: about 4 ms of a small trace's median on
two cores (scratch A/B of 150-request loops, three pairs). But httptools
holds a request line or a header of any length, so an anonymous client
could grow the process without end (tests/test_hostile_traffic.py). This
counts what arrives while a request's head (its line and headers) is still
unfinished, and past `MAX_REQUEST_HEAD` answers 400 and closes, as h11 did.

The count is of whole reads: a read that finishes one request's body and
starts the next (pipelining, which browsers do not do) counts whole towards
the next head, so the bound may trip early by at most one read.

It must never look into a request's body, nor act once the head is done.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: Largest request head (request line and headers) the server reads.
MAX_REQUEST_HEAD = 64 * 1024


class BoundedHttpTools(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._in_head = True

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._in_head = True

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

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

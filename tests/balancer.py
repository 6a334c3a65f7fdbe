"""A TCP load balancer for the tests, on loopback: each connection goes to a chosen backend.

It stands for the proxy a deployment puts in front of several API processes.
``route`` picks the backend of each new connection from its first bytes, so a
test can send the client's websocket to one API process and its HTTP requests
to another, and prove that nothing depends on both landing on the same one.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from nnhost.testing import free_port

#: Given a connection's first bytes, the index of the backend it goes to.
Route = Callable[[bytes], int]


def websockets_to_first(head: bytes) -> int:
    """A websocket upgrade to backend 0, every other request to backend 1."""
    return 0 if b"upgrade: websocket" in head.lower() else 1


class Balancer:
    def __init__(self, backends: list[int], route: Route) -> None:
        self.backends = backends
        self.route = route
        self.port = free_port()
        #: How many connections went to each backend, and what their first lines were.
        self.sent: list[list[str]] = [[] for _ in backends]
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start():
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                head += chunk
            index = self.route(head)
            self.sent[index].append(head.split(b"\r\n", 1)[0].decode("latin-1"))
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backends[index])
        except (OSError, ConnectionError):
            writer.close()
            return
        up_writer.write(head)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while chunk := await source.read(65536):
                    sink.write(chunk)
                    await sink.drain()
            except (OSError, ConnectionError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        def close():
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(close)
        self._thread.join(10)

"""The doorman's rules, one per test: who gives way to a newcomer, and who is never closed.

Over real sockets, against a server with a lowered descriptor limit, the
same rules keep ``/ping`` and a trace answered (`test_hostile_traffic`).
"""

from __future__ import annotations

import asyncio
import resource
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from nnhost.api.connections import ConnectionLimits, Doorman, Refused
from nnhost.api.transport import guarded_protocols


class Connection:
    def __init__(self, name: str) -> None:
        self.name = name
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True

    def __repr__(self) -> str:
        return self.name


def doorman(ceiling: int = 3, per_address: int = 10, exempt: tuple[str, ...] = ()) -> Doorman:
    return Doorman(ConnectionLimits(ceiling=ceiling, per_address=per_address, head_timeout=20,
                                    body_timeout=300, exempt=exempt))


def test_past_the_ceiling_the_connection_waiting_longest_gives_way():
    keeper = doorman(ceiling=3)
    first, second, third = (Connection(n) for n in ("first", "second", "third"))
    doors = [keeper.admit("10.0.0.1", c) for c in (first, second, third)]
    keeper.waiting(doors[0])  # answered a request and waits again: now the newest
    keeper.admit("10.0.0.2", Connection("newcomer"))
    assert (first.evicted, second.evicted, third.evicted) == (False, True, False)
    assert keeper.open == 3 and keeper.evicted == 1


def test_a_connection_being_served_is_never_closed_and_a_full_house_refuses():
    keeper = doorman(ceiling=2)
    served = [Connection("a"), Connection("b")]
    for door in [keeper.admit("10.0.0.1", c) for c in served]:
        keeper.busy(door)
    with pytest.raises(Refused, match="all it may"):
        keeper.admit("10.0.0.2", Connection("newcomer"))
    assert not any(c.evicted for c in served) and keeper.open == 2 and keeper.refused == 1


def test_an_address_past_its_cap_closes_its_own_oldest_not_anyone_elses():
    keeper = doorman(ceiling=100, per_address=2)
    other = Connection("other")
    keeper.admit("10.0.0.9", other)  # older than all of the flooder's
    flood = [Connection(f"f{i}") for i in range(2)]
    for connection in flood:
        keeper.admit("10.0.0.1", connection)
    keeper.admit("10.0.0.1", Connection("f2"))
    assert flood[0].evicted and not flood[1].evicted and not other.evicted
    assert keeper.held_by("10.0.0.1") == 2


def test_an_address_whose_connections_are_all_busy_is_refused_the_next():
    keeper = doorman(ceiling=100, per_address=1)
    keeper.busy(keeper.admit("10.0.0.1", Connection("websocket")))
    with pytest.raises(Refused, match="most one address may hold"):
        keeper.admit("10.0.0.1", Connection("one more"))
    keeper.admit("10.0.0.2", Connection("elsewhere"))  # another address is not affected


def test_a_named_proxy_is_exempt_from_the_per_address_cap():
    keeper = doorman(ceiling=100, per_address=1, exempt=("10.1.0.0/16",))
    for index in range(5):
        keeper.busy(keeper.admit("10.1.2.3", Connection(f"via proxy {index}")))
    assert keeper.held_by("10.1.2.3") == 5
    keeper.busy(keeper.admit("10.2.0.1", Connection("not a proxy")))
    with pytest.raises(Refused):
        keeper.admit("10.2.0.1", Connection("not a proxy either"))


def test_a_door_counts_once_however_often_it_is_closed():
    keeper = doorman(ceiling=1)
    door = keeper.admit("10.0.0.1", Connection("a"))
    keeper.gone(door)
    keeper.gone(door)  # the protocol's connection_lost after an eviction, say
    keeper.waiting(door)  # a late callback of a closed connection changes nothing
    assert keeper.open == 0 and keeper.held_by("10.0.0.1") == 0
    keeper.admit("10.0.0.1", Connection("b"))
    assert keeper.open == 1


def test_an_evicted_door_frees_its_place_at_once():
    """A burst of newcomers each closes one waiting connection, never the same one twice."""
    keeper = doorman(ceiling=3)
    old = [Connection(f"old{i}") for i in range(3)]
    for connection in old:
        keeper.admit("10.0.0.1", connection)
    for index in range(3):
        keeper.admit("10.0.0.2", Connection(f"new{index}"))
    assert all(c.evicted for c in old) and keeper.evicted == 3 and keeper.open == 3


# -- the same rules on real sockets, and the deadlines: uvicorn with the guarded protocols ---------


class App:
    """A tiny ASGI app: /ping answers at once, /hold answers when the test lets it, /echo reads the body."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.held = 0
        self.disconnects = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})
            while (await receive())["type"] != "websocket.disconnect":
                pass
            return
        if scope["path"] == "/hold":
            self.held += 1
            await self.release.wait()
        body = b""
        if scope["path"] == "/echo":
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.disconnects += 1
                    return
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body or b"pong"})


@contextmanager
def guarded_server(limits: ConnectionLimits):
    import uvicorn

    app, keeper = App(), Doorman(limits)
    http, websocket = guarded_protocols(keeper)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=http, ws=websocket,
                                           log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the test server did not start"
        time.sleep(0.02)
    try:
        yield port, app, keeper, server
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _limits(**changes) -> ConnectionLimits:
    base = dict(ceiling=100, per_address=100, head_timeout=30.0, body_timeout=30.0)
    return ConnectionLimits(**{**base, **changes})


def _reply(sock: socket.socket, timeout: float = 30) -> bytes:
    """Everything the server writes until it closes the connection."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _wait_for(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the state waited for never came"
        time.sleep(0.02)


def test_a_head_that_does_not_arrive_in_time_is_answered_408_and_closed():
    with guarded_server(_limits(head_timeout=1.0)) as (port, _, keeper, _server):
        silent = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n")  # and never the end of the head
        for sock in (silent, half):
            reply = _reply(sock)
            assert reply.startswith(b"HTTP/1.1 408") and b"within 1 seconds" in reply, reply
            sock.close()
        _wait_for(lambda: keeper.open == 0)


def test_a_kept_alive_connection_waits_for_its_next_head_under_the_same_deadline():
    with guarded_server(_limits(head_timeout=3.0)) as (port, _, keeper, _server):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            # Four requests a second apart outlast one head's deadline: each answer
            # restarts its clock (each pause leaves 2 s to spare on a busy machine).
            for _ in range(4):
                sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.settimeout(30)
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
                time.sleep(1.0)
            # Idle after its answer, it meets the head's deadline (before uvicorn's 5 s keep-alive).
            assert _reply(sock).startswith(b"HTTP/1.1 408")
        _wait_for(lambda: keeper.open == 0)


def test_a_body_that_does_not_arrive_in_time_ends_the_connection():
    with guarded_server(_limits(body_timeout=1.0)) as (port, app, keeper, _server):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
            assert _reply(sock) == b""  # closed, no answer beside the app's
        _wait_for(lambda: keeper.open == 0 and app.disconnects == 1)
        # A body that arrives in time is read whole.
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
            assert _reply(sock).endswith(b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n")


def test_past_the_ceiling_idle_connections_give_way_and_a_full_house_is_told_503():
    with guarded_server(_limits(ceiling=4)) as (port, app, keeper, server):
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        _wait_for(lambda: keeper.open == 4)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert _reply(sock).startswith(b"HTTP/1.1 200")
        assert _reply(idle[0]) == b"" and keeper.evicted == 1  # the longest-waiting one gave way
        # Four requests in progress: nothing may give way, and the newcomer is refused.
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        for sock in held:
            sock.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        _wait_for(lambda: app.held == 4 and keeper.open == 4)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            reply = _reply(sock)
        assert reply.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in reply and b"all it may" in reply
        asyncio.run_coroutine_threadsafe(_set(app.release), _loop_of(server)).result(10)
        for sock in held:
            assert _reply(sock).startswith(b"HTTP/1.1 200")
            sock.close()
        for sock in idle:
            sock.close()
        _wait_for(lambda: keeper.open == 0)


def test_a_websocket_holds_its_door_until_it_closes():
    from websockets.sync.client import connect

    with guarded_server(_limits(per_address=1)) as (port, _, keeper, _server):
        with connect(f"ws://127.0.0.1:{port}/socket", open_timeout=30):
            _wait_for(lambda: keeper.open == 1)
            with socket.create_connection(("127.0.0.1", port)) as sock:
                reply = _reply(sock)
            assert reply.startswith(b"HTTP/1.1 503") and b"one address may hold" in reply
        _wait_for(lambda: keeper.open == 0)


async def _set(event: asyncio.Event) -> None:
    event.set()


def _loop_of(server) -> asyncio.AbstractEventLoop:
    return server.servers[0].get_loop()  # the loop uvicorn serves on, in its thread


def test_a_low_descriptor_limit_lowers_the_ceiling_never_to_nothing():
    """A hard limit below max_connections + the reserve: half of it for connections, at least."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for limit, expected in ((512, ["256", "256"]), (1536, ["768", "768"]), (4096, ["1000", "1024"])):
        if hard != resource.RLIM_INFINITY and hard < limit:
            continue  # this machine's own hard limit is lower: that case cannot be set up here
        probe = (
            "import resource\n"
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n"
            "from nnhost.cli.serve import descriptor_budget\n"
            "print(*descriptor_budget(1000, 1024))\n"
        )
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == expected, (limit, done.stdout, done.stderr[-2000:])

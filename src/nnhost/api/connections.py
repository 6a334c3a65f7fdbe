"""`Doorman`: which connections the API process holds, and which one gives way to a newcomer.

Why it exists: a connection costs a descriptor from the moment it is
accepted, long before it has said who it is. Anonymous clients that open
connections and send half a request (or nothing) would otherwise hold every
descriptor of the process, and a well-behaved client's ``/ping`` would wait
for ever behind them. The doorman keeps the count of open connections below
a ceiling that leaves descriptors in reserve for the process's own files,
and lets a newcomer in by closing the connection that has waited longest
without finishing a request's head: whoever is sending a request promptly is
never the one closed. An address may hold only so many connections; past
that, its own longest-waiting one gives way, or, if all of them are busy,
the newcomer is refused.

It only decides: the protocol (`api.transport`) tells it each change of a
connection's phase and carries out what it says (close one, refuse one). It
must never read a request, never look at a key, and never close a
connection whose request is being served or whose websocket is open.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Iterable, Optional, Protocol


class Closable(Protocol):
    """What the doorman closes: a connection's way out (the protocol's ``evict``)."""

    def evict(self) -> None: ...


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits one API process applies to its connections (from `config.Settings`)."""

    #: Connections held at once (websockets included), after the descriptor reserve.
    ceiling: int
    #: Connections one client address may hold at once.
    per_address: int
    #: Seconds a request's head (line and headers) may take, from the first moment it is awaited.
    head_timeout: float
    #: Seconds a request's body may take to arrive once its head is complete.
    body_timeout: float
    #: Peers exempt from the per-address cap: the proxies the operator named.
    exempt: tuple[str, ...] = ()


@dataclass(eq=False)
class Door:
    """One admitted connection: its peer address, and whether it waits for a request's head."""

    address: str
    connection: Closable
    waiting: bool = True
    closed: bool = False


@dataclass
class _Address:
    doors: int = 0
    #: This address's waiting doors, longest-waiting first (dicts keep insertion order).
    waiting: dict[Door, None] = field(default_factory=dict)


class Refused(Exception):
    """A newcomer the doorman does not admit; the text is what the client is told."""


class Doorman:
    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._exempt = _Matcher(limits.exempt)
        self._open = 0
        #: Every waiting door, longest-waiting first.
        self._waiting: dict[Door, None] = {}
        self._addresses: dict[str, _Address] = {}
        self.evicted = 0
        self.refused = 0

    @property
    def open(self) -> int:
        return self._open

    def admit(self, address: str, connection: Closable) -> Door:
        """Let a newcomer in, closing whichever connections must give way; raise `Refused` if none may."""
        here = self._addresses.get(address)
        if here is not None and here.doors >= self.limits.per_address and not self._exempt(address):
            if not here.waiting:
                self.refused += 1
                raise Refused(
                    f"This address already holds {here.doors} connections to this server, the most "
                    "one address may hold, and each is in use. Close some and try again."
                )
            self._evict(next(iter(here.waiting)))
        if self._open >= self.limits.ceiling:
            if not self._waiting:
                self.refused += 1
                raise Refused(
                    f"This server holds {self._open} connections, all it may, and each is in use. "
                    "Try again shortly."
                )
            self._evict(next(iter(self._waiting)))
        door = Door(address, connection)
        self._open += 1
        here = self._addresses.setdefault(address, _Address())
        here.doors += 1
        self._wait(door, here)
        return door

    def waiting(self, door: Door) -> None:
        """``door`` now waits for a request's head (it connected, or answered one and stays open)."""
        here = self._addresses.get(door.address)
        if door.closed or here is None:
            return
        self._unwait(door, here)
        self._wait(door, here)

    def busy(self, door: Door) -> None:
        """``door`` has sent a whole head: a request (or a websocket) is under way, never closed here."""
        here = self._addresses.get(door.address)
        if not door.closed and here is not None:
            self._unwait(door, here)

    def gone(self, door: Door) -> None:
        """``door`` closed, whoever closed it. Safe to call more than once."""
        here = self._addresses.get(door.address)
        if door.closed or here is None:
            return
        door.closed = True
        self._unwait(door, here)
        self._open -= 1
        here.doors -= 1
        if here.doors <= 0:
            del self._addresses[door.address]

    def held_by(self, address: str) -> int:
        here = self._addresses.get(address)
        return here.doors if here is not None else 0

    def _wait(self, door: Door, here: _Address) -> None:
        door.waiting = True
        self._waiting[door] = None
        here.waiting[door] = None

    def _unwait(self, door: Door, here: _Address) -> None:
        door.waiting = False
        self._waiting.pop(door, None)
        here.waiting.pop(door, None)

    def _evict(self, door: Door) -> None:
        # Counted gone now: its descriptor is released as the loop closes it.
        self.gone(door)
        self.evicted += 1
        door.connection.evict()


class _Matcher:
    """Whether an address is one of the named proxies (addresses, networks, or "*" for any)."""

    def __init__(self, names: Iterable[str]) -> None:
        self._any = False
        self._networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self._names: set[str] = set()
        for name in names:
            if name == "*":
                self._any = True
                continue
            try:
                self._networks.append(ipaddress.ip_network(name, strict=False))
            except ValueError:
                self._names.add(name)  # a unix socket's name, or a host name uvicorn would match as text

    def __call__(self, address: str) -> bool:
        if self._any or address in self._names:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._networks)


def peer_address(client: Optional[tuple[str, int]]) -> str:
    """The address a connection came from (empty for a unix socket, which has none)."""
    return client[0] if client else ""

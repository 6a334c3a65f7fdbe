"""Which nnsight clients this installation serves, how a client's version is matched, and the refusal.

Why it exists: a job runs with the nnsight code of the version that serves
it, and a client whose nnsight is not that version can get a silently
different result (an attention output that 0.8.0 returns locally came back
as ``None`` when 0.8.1 ran its request). So a client is served only by a
runtime of its own version, and any other is refused before its request is
read, with text its user sees in their own client, naming the versions
served and the install that works. The served list lives here, once; the
operator narrows it with the ``client_versions`` setting.

It must never guess: a version it cannot read (a client run from a source
tree) is let through, as the server cannot know what that code is, and the
refusal names only versions this installation really serves.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import version
from typing import Optional, Sequence

from packaging.version import InvalidVersion, Version


@cache
def own_version() -> str:
    """The server's own nnsight: its clients' jobs run in the host's own runtime."""
    return version("nnsight")


def served_client_versions() -> tuple[str, ...]:
    """The nnsight versions this installation can serve: its own, then each runtime built here."""
    from .runtimes import installed

    own = own_version()
    return (own,) + tuple(name for name in installed() if name != own)


def serving_version(sent: str, served: Sequence[str]) -> Optional[str]:
    """The served version that serves a client sending ``sent``, or None if none does.

    Matched by release (``0.8.1rc1`` and ``0.8.1.post1`` are 0.8.1's); a
    ``sent`` that is empty or not a version is let through as the first
    served one.
    """
    try:
        release = Version(sent).release
    except InvalidVersion:
        return served[0]
    return next((name for name in served if Version(name).release == release), None)


def runtime_for(sent: str, served: Sequence[str]) -> str:
    """The runtime that serves a client sending ``sent`` (`serving_version`); empty: the server's own."""
    matched = serving_version(sent, served)
    return "" if matched is None or matched == own_version() else matched


def refusal(sent: str, served: Sequence[str]) -> str:
    """What a client of an unserved version is told."""
    newest = max(served, key=Version)
    listed = ", ".join(sorted(served, key=Version, reverse=True))
    return (
        f"This server serves nnsight {listed} clients, each with that version's own code; your "
        f"client runs nnsight {sent}. Install a version it serves: `pip install nnsight=={newest}`."
    )


def socketio_era(version_name: str) -> bool:
    """Whether a client of ``version_name`` speaks the protocol before 0.8 (Socket.IO, a raw body)."""
    try:
        return Version(version_name).release < (0, 8)
    except InvalidVersion:
        return False

"""What every route needs: the server's parts, the caller's identity, client checks.

Refusals here are written for the person reading them in their notebook: the
nnsight client shows a 4xx ``detail`` verbatim. Checking a key reads the key
store (a database) and may count in Redis, so `identify`, `require_principal`
and `admit` are coroutines that make those calls through `run_blocking`.
"""

from __future__ import annotations

import re
from typing import Optional, cast

from fastapi import HTTPException, Request, WebSocket
from pydantic import ValidationError
from starlette.types import Message

from ..auth.access import Throttled
from ..auth.keys import KeyCheck, KeyProblem, Principal
from ..auth.limits import Limits, retry_after
from ..client_versions import refusal, runtime_for, serving_version
from ..storage.blocking import run_blocking
from .server import Server

API_KEY_HEADER = "ndif-api-key"

_HOW_TO_SET_KEY = (
    "Set it in the environment (`export NDIF_API_KEY=<your key>`) or in Python "
    "(`nnsight.CONFIG.set_default_api_key('<your key>')`), or run `nnsight login`."
)


def server_of(request: Request) -> Server:
    server: Server = request.app.state.server
    return server


def server_of_socket(websocket: WebSocket) -> Server:
    server: Server = websocket.app.state.server
    return server


def client_address(request: Request) -> str:
    """The caller's address (uvicorn has already applied trusted proxy headers)."""
    return request.client.host if request.client else "unknown"


class BodyTooLarge(Exception):
    """A request body past its route's limit; ``size`` is what was declared or read so far."""

    def __init__(self, size: int, limit: int, known: bool) -> None:
        super().__init__(size, limit, known)
        self.size, self.limit, self.known = size, limit, known


def bounded(request: Request, limit: int) -> Request:
    """``request`` whose body may not pass ``limit`` bytes: `BodyTooLarge` before reading past it.

    A declared length over the limit is refused before a byte is read; a
    chunked body (no length) is counted as it arrives, and reading stops the
    moment it passes. Call it after the caller is known (a key, a session):
    nobody's body is read before that.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(int(declared), limit, known=True)
    receive, received = request.receive, 0

    async def counted_receive() -> Message:
        nonlocal received
        message = await receive()
        if message.get("type") == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise BodyTooLarge(received, limit, known=False)
        return message

    return Request(request.scope, counted_receive)


def validation_problems(error: ValidationError, whole: str) -> str:
    """A pydantic error as ``field: problem; ...`` (``whole`` names a problem with all of it)."""
    return "; ".join(
        f"{'.'.join(str(part) for part in issue['loc']) or whole}: {issue['msg']}"
        for issue in error.errors()
    )


def too_many(error: Throttled) -> HTTPException:
    headers = {"Retry-After": retry_after(error.retry_after)}
    return HTTPException(429, error.message, headers=headers)


async def identify(server: Server, key: Optional[str]) -> Optional[Principal]:
    """The key's owner, or None (never raises): for routes that work anonymously."""
    return await run_blocking(server.access.identify, key)


async def require_principal(request: Request) -> Principal:
    """The caller, or a 401/403 saying how to fix the key (429: the address keeps guessing)."""
    server = server_of(request)
    try:
        check = await run_blocking(
            server.access.authenticate,
            request.headers.get(API_KEY_HEADER),
            client_address(request),
        )
    except Throttled as error:
        raise too_many(error) from None
    return _principal_of(check)


async def require_admitted(request: Request) -> tuple[Principal, Limits]:
    """`require_principal`, then `admit`, in one trip to a worker thread (a job's submission)."""
    access = server_of(request).access
    key, address = request.headers.get(API_KEY_HEADER), client_address(request)

    def check() -> tuple[KeyCheck, Optional[Limits]]:
        checked = access.authenticate(key, address)
        return checked, access.admit(checked.principal) if checked.principal is not None else None

    try:
        checked, limits = await run_blocking(check)
    except Throttled as error:
        raise too_many(error) from None
    principal = _principal_of(checked)
    assert limits is not None  # admitted along with every key that names a principal
    return principal, limits


def _principal_of(check: KeyCheck) -> Principal:
    """The check's principal, or the 401/403 that says what is wrong with the key."""
    if check.principal is not None:
        return check.principal
    if check.problem is KeyProblem.MISSING:
        raise HTTPException(401, f"This server needs an API key and none was sent. {_HOW_TO_SET_KEY}")
    reasons = {
        KeyProblem.UNKNOWN: "The API key sent is not known to this server",
        KeyProblem.REVOKED: "The API key sent has been revoked",
        KeyProblem.EXPIRED: "The API key sent has expired",
        KeyProblem.DISABLED: "The account of the API key sent is disabled",
    }
    raise HTTPException(
        403,
        # A check without a principal always names its problem.
        f"{reasons[cast(KeyProblem, check.problem)]}. Get a new key from the server's operator or its "
        f"key page, then use it: {_HOW_TO_SET_KEY}",
    )


#: The release at the start of ``sys.version`` (``3.12.1``, ``3.13.0rc2``, ``3.14.0a1+``).
_PYTHON_RELEASE = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?(?:(?:a|b|rc)[0-9]{1,3})?\+?")


def client_python(request: Request) -> str:
    """The Python the client runs on, from its ``python-version`` header (``sys.version``).

    Only the release travels on (into the job's row and its process), and only
    when it reads as one: the header is the client's word, used to translate
    and to explain, never to decide what a payload may do.
    """
    sent = request.headers.get("python-version", "").strip().split(" ", 1)[0]
    return sent if _PYTHON_RELEASE.fullmatch(sent) else ""


def client_version(request: Request) -> str:
    """The served nnsight version whose runtime runs this client's job; empty: the server's own.

    Called after `check_client_version` let the request through, so a version
    sent is one served (or one that cannot be read, which the server's own serves).
    """
    return runtime_for(request.headers.get("nnsight-version", "").strip(), server_of(request).settings.client_versions)


def check_client_version(request: Request) -> None:
    """Refuse an nnsight client of a version this server does not serve (400 naming those it does)."""
    served = server_of(request).settings.client_versions
    sent = request.headers.get("nnsight-version", "").strip()
    if sent and serving_version(sent, served) is None:
        raise HTTPException(400, refusal(sent, served))

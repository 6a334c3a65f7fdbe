"""The account pages: sign up, log in, API keys, recent jobs.

HTTP only: read the form (see `pages` for sessions, CSRF and rendering), call
`nnhost.auth`, render a template. A page shows only the signed-in user's own
keys and jobs; another user's job or key is "not found", exactly like one that
does not exist.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from ..auth.access import Throttled
from ..auth.accounts import AccountError
from ..auth.limits import describe, retry_after
from ..jobs.job import Job, Status
from ..storage.blocking import run_blocking
from ..web import STATIC
from . import replies
from .deps import client_address, server_of
from .pages import (
    SESSION_COOKIE,
    Viewer,
    base_url,
    form_field,
    message,
    read_form,
    redirect,
    render,
    safe_next,
    signed_in,
    to_login,
    viewer_of,
)

router = APIRouter(include_in_schema=False)

#: Expiry choices offered when making a key: label -> seconds (None: never).
KEY_EXPIRY = {
    "never": None,
    "1 day": 86400,
    "30 days": 30 * 86400,
    "90 days": 90 * 86400,
    "1 year": 365 * 86400,
}


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")


#: Password hashes computed at once (argon2id: about 50 ms and 64 MiB each).
HASHING_AT_ONCE = max(1, (os.cpu_count() or 2) // 2)
#: Logins and sign-ups waiting for a hash, past which a new one is told to come back.
HASHING_QUEUE = 32

T = TypeVar("T")


class Busy(Throttled):
    """Too many password checks waiting: come back shortly (503, not the caller's fault)."""


async def password_work(request: Request, function: Callable[..., T], *args: Any) -> T:
    """Run a login or sign-up (it hashes a password) in a thread, a few at a time.

    Never on the event loop: a burst of logins would stall every websocket.
    The pool is bounded (argon2 is memory-hard), and so is the queue before it.
    """
    state = request.app.state
    limiter = getattr(state, "password_hashing", None)
    if limiter is None:  # made on the app's own event loop, on first use
        limiter = state.password_hashing = anyio.CapacityLimiter(HASHING_AT_ONCE)
    if limiter.statistics().tasks_waiting >= HASHING_QUEUE:
        raise Busy("The server is busy checking passwords. Try again in a few seconds.", 5.0)
    return await anyio.to_thread.run_sync(functools.partial(function, *args), limiter=limiter)


# -- signing up, in and out ---------------------------------------------------------


@router.get("/login")
async def login_page(request: Request, next: str = "/keys") -> Response:
    viewer = await viewer_of(request)
    if viewer is not None:
        return redirect(safe_next(next))
    return render(request, "login.html", viewer=None, email="", error=None, next=safe_next(next))


@router.post("/login")
async def login(request: Request) -> Response:
    viewer = await viewer_of(request)
    if viewer is not None and server_of(request).access.open:
        return redirect("/keys")
    form, refusal = await read_form(request, None)
    if refusal:
        return refusal
    assert form is not None  # read_form gives a form or a refusal
    email, target = form_field(form, "email"), safe_next(form_field(form, "next"))
    try:
        signed = await password_work(
            request, server_of(request).accounts.login,
            email, form_field(form, "password"), client_address(request),
        )
    except Throttled as error:
        headers = {"Retry-After": retry_after(error.retry_after)}
        return render(
            request, "login.html", viewer=None, status=503 if isinstance(error, Busy) else 429,
            headers=headers, email=email, next=target, error=error.message,
        )
    except AccountError as error:
        return render(
            request, "login.html", viewer=None, status=401, email=email, next=target,
            error=str(error),
        )
    return signed_in(request, signed, target)


@router.get("/signup")
async def signup_page(request: Request, invite: str = "") -> Response:
    viewer = await viewer_of(request)
    if viewer is not None:
        return redirect("/keys")
    status = 403 if server_of(request).settings.signup == "closed" else 200
    return render(
        request, "signup.html", viewer=None, status=status, email="", invite=invite, error=None
    )


@router.post("/signup")
async def signup(request: Request) -> Response:
    if server_of(request).access.open:
        return redirect("/keys")
    form, refusal = await read_form(request, None)
    if refusal:
        return refusal
    assert form is not None  # read_form gives a form or a refusal
    email, invite = form_field(form, "email"), form_field(form, "invite")
    password = form_field(form, "password")

    def again(status: int, error: str, headers: Optional[dict[str, str]] = None) -> HTMLResponse:
        return render(
            request, "signup.html", viewer=None, status=status, headers=headers,
            email=email, invite=invite, error=error,
        )

    if password != form_field(form, "confirm"):
        return again(400, "The two passwords differ. Type the same password twice.")
    try:
        signed = await password_work(
            request, server_of(request).accounts.signup, email, password, invite, client_address(request)
        )
    except Throttled as error:
        status = 503 if isinstance(error, Busy) else 429
        return again(status, error.message, {"Retry-After": retry_after(error.retry_after)})
    except AccountError as error:
        return again(403 if server_of(request).settings.signup == "closed" else 400, str(error))
    return signed_in(request, signed, "/keys?welcome=1")


@router.post("/logout")
async def logout(request: Request) -> Response:
    viewer = await viewer_of(request)
    if viewer is None or viewer.session_token is None:
        return redirect("/login")
    form, refusal = await read_form(request, viewer)
    if refusal:
        return refusal
    await run_blocking(server_of(request).accounts.logout, viewer.session_token)
    response = redirect("/login")
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


# -- keys ---------------------------------------------------------------------------


async def _keys_page(
    request: Request,
    viewer: Viewer,
    *,
    status: int = 200,
    new_key: Optional[str] = None,
    notice: Optional[str] = None,
    error: Optional[str] = None,
) -> HTMLResponse:
    server = server_of(request)
    base = base_url(request)
    return render(
        request,
        "keys.html",
        viewer=viewer,
        status=status,
        keys=await run_blocking(server.keys.keys, viewer.principal.user_id),
        now=time.time(),
        new_key=new_key,
        notice=notice,
        error=error,
        expiry_choices=list(KEY_EXPIRY),
        limits=describe(server.access.limits(viewer.principal)),
        base_url=base,
        example_model=next(iter(server.catalog), None),
    )


@router.get("/keys")
async def keys_page(request: Request, welcome: int = 0, revoked: int = 0) -> Response:
    viewer = await viewer_of(request)
    if viewer is None:
        return to_login(request)
    notice = None
    if welcome:
        notice = "Welcome! Make an API key below to use this server from nnsight."
    if revoked:
        mine = await run_blocking(server_of(request).keys.keys, viewer.principal.user_id)
        gone = [k for k in mine if k.id == revoked]
        if gone:
            notice = f"Key {gone[0].prefix}… is revoked; requests sent with it are refused."
    return await _keys_page(request, viewer, notice=notice)


@router.post("/keys")
async def create_key(request: Request) -> Response:
    viewer = await viewer_of(request)
    if viewer is None:
        return to_login(request)
    form, refusal = await read_form(request, viewer)
    if refusal:
        return refusal
    assert form is not None  # read_form gives a form or a refusal
    name = form_field(form, "name").strip()[:100] or "web"
    expiry = form_field(form, "expires") or "never"
    if expiry not in KEY_EXPIRY:
        return await _keys_page(request, viewer, status=400, error="Choose an expiry from the list.")
    seconds = KEY_EXPIRY[expiry]
    key = await run_blocking(
        server_of(request).keys.create_key,
        viewer.principal.user_id,
        name=name,
        expires_at=time.time() + seconds if seconds else None,
    )
    # Shown in this response only: it is not stored anywhere in clear, so a reload won't show it.
    return await _keys_page(request, viewer, status=201, new_key=key)


@router.post("/keys/{key_id}/revoke")
async def revoke_key(key_id: int, request: Request) -> Response:
    viewer = await viewer_of(request)
    if viewer is None:
        return to_login(request)
    form, refusal = await read_form(request, viewer)
    if refusal:
        return refusal
    server = server_of(request)
    mine = [k for k in await run_blocking(server.keys.keys, viewer.principal.user_id) if k.id == key_id]
    if not mine:
        return message(request, viewer, 404, "Not found", "You have no such key.")
    await run_blocking(server.keys.revoke_key, key_id, user_id=viewer.principal.user_id)
    return redirect(f"/keys?revoked={key_id}")


# -- jobs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    job: Job
    runtime: Optional[float]
    result_url: Optional[str]

    @property
    def active(self) -> bool:
        return not self.job.status.final


def _row(request: Request, job: Job) -> JobRow:
    server = server_of(request)
    meta = job.meta or {}
    runtime = meta.get("runtime")
    url = None
    if (
        job.status is Status.COMPLETED
        and job.result_expires_at is not None
        and job.result_expires_at > time.time()
    ):
        url = replies.result_url(server, job.id, job.result_expires_at, str(request.base_url))
    return JobRow(job, runtime if isinstance(runtime, (int, float)) else None, url)


@router.get("/jobs")
async def jobs_page(request: Request) -> Response:
    viewer = await viewer_of(request)
    if viewer is None:
        return to_login(request)
    jobs = await server_of(request).jobs.for_user(viewer.principal.user_id, limit=100)
    rows = [_row(request, job) for job in jobs]
    # Refresh by itself while something is still waiting or running.
    refresh = any(row.active for row in rows)
    return render(request, "jobs.html", viewer=viewer, rows=rows, refresh=refresh)


@router.get("/jobs/{job_id}")
async def job_page(job_id: str, request: Request) -> Response:
    viewer = await viewer_of(request)
    if viewer is None:
        return to_login(request)
    server = server_of(request)
    job = await server.jobs.get(job_id)
    if job is None or job.user_id != viewer.principal.user_id:
        return message(request, viewer, 404, "Not found", f"You have no job {job_id}.")
    row = _row(request, job)
    logs = await server.jobs.logs(job.id)
    return render(request, "job.html", viewer=viewer, row=row, logs=logs, refresh=row.active)

"""What every account page needs: who is looking, rendering, forms, cookies.

The session cookie is HTTP-only, SameSite=Lax and Secure when the page was
reached over HTTPS. Every POST carries a CSRF token bound to the session (or,
before login, to a random per-browser cookie), and `read_form` refuses a form
without the right one. Pages are sent with headers that forbid framing and any
script but our own file.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Optional, Union
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.datastructures import FormData

from ..auth.accounts import SignedIn
from ..auth.keys import Principal
from ..auth.sessions import csrf_matches, csrf_token
from ..storage.blocking import run_blocking
from ..web import environment
from .deps import BodyTooLarge, bounded, server_of

SESSION_COOKIE = "nnhost_session"
FORM_COOKIE = "nnhost_form"
#: Largest form a page accepts (emails, passwords, key names: all small).
_MAX_FORM_BYTES = 16 * 1024
_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}
_templates = environment()


@dataclass(frozen=True)
class Viewer:
    """Who is looking at a page: a session's user, or the local admin with ``--auth none``."""

    principal: Principal
    session_token: Optional[str]


def is_https(request: Request) -> bool:
    public = server_of(request).settings.public_url or ""
    return request.url.scheme == "https" or public.startswith("https://")


async def viewer_of(request: Request) -> Optional[Viewer]:
    """Who is signed in (their session's row, read through `run_blocking`), or None."""
    server = server_of(request)
    access = server.access
    if access.open:
        assert access.local_admin is not None  # an open server always has its local admin
        return Viewer(access.local_admin, None)
    token = request.cookies.get(SESSION_COOKIE)
    principal = await run_blocking(server.accounts.sessions.principal, token)
    return Viewer(principal, token) if principal is not None else None


def _csrf_secret(request: Request, viewer: Optional[Viewer]) -> tuple[str, str, Optional[str]]:
    """(secret, purpose, a new form cookie to set or None) for this page's CSRF token."""
    if viewer is not None and viewer.session_token:
        return viewer.session_token, "session", None
    existing = request.cookies.get(FORM_COOKIE)
    if existing and len(existing) >= 32:
        return existing, "form", None
    fresh = secrets.token_urlsafe(32)
    return fresh, "form", fresh


def render(
    request: Request,
    template: str,
    *,
    viewer: Optional[Viewer],
    status: int = 200,
    headers: Optional[dict[str, str]] = None,
    **context: Any,
) -> HTMLResponse:
    server = server_of(request)
    secret, purpose, new_cookie = _csrf_secret(request, viewer)
    html = _templates.get_template(template).render(
        viewer=viewer,
        csrf=csrf_token(secret, purpose),
        signup_mode=server.settings.signup,
        open_mode=server.access.open,
        **context,
    )
    response = HTMLResponse(html, status_code=status, headers={**_HEADERS, **(headers or {})})
    if new_cookie:
        response.set_cookie(
            FORM_COOKIE,
            new_cookie,
            httponly=True,
            samesite="lax",
            secure=is_https(request),
            path="/",
        )
    return response


def message(
    request: Request,
    viewer: Optional[Viewer],
    status: int,
    title: str,
    text: str,
    headers: Optional[dict[str, str]] = None,
) -> HTMLResponse:
    """A page that only says something (not found, form expired...)."""
    return render(
        request, "message.html", viewer=viewer, status=status, headers=headers,
        title=title, text=text,
    )


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})


def to_login(request: Request) -> RedirectResponse:
    return redirect("/login?next=" + quote(request.url.path))


def safe_next(target: Optional[str]) -> str:
    """Only same-site paths after login (never an open redirect)."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/keys"


async def read_form(
    request: Request, viewer: Optional[Viewer]
) -> Union[tuple[FormData, None], tuple[None, HTMLResponse]]:
    """The POSTed form, or an HTML refusal when it is too big or its CSRF token is wrong."""
    try:
        form = await bounded(request, _MAX_FORM_BYTES).form(max_files=0, max_fields=16)
    except BodyTooLarge:
        return None, message(request, viewer, 413, "Too large", "That form is too large.")
    except Exception:
        return None, message(request, viewer, 400, "Bad form", "That form could not be read.")
    sent = form.get("csrf")
    sent = sent if isinstance(sent, str) else None
    if viewer is not None and viewer.session_token:
        good = csrf_matches(viewer.session_token, sent, "session")
    else:
        good = csrf_matches(request.cookies.get(FORM_COOKIE), sent, "form")
    if not good:
        return None, message(
            request, viewer, 403, "Form expired",
            "This form has expired or did not come from this site. Go back, reload the page "
            "and try again.",
        )
    return form, None


def form_field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def signed_in(request: Request, signed: SignedIn, target: str) -> RedirectResponse:
    response = redirect(target)
    response.set_cookie(
        SESSION_COOKIE,
        signed.session_token,
        max_age=int(server_of(request).settings.session_ttl),
        httponly=True,
        samesite="lax",
        secure=is_https(request),
        path="/",
    )
    return response


def base_url(request: Request) -> str:
    return (server_of(request).settings.public_url or str(request.base_url)).rstrip("/")

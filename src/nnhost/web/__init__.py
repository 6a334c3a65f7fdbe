"""Templates and static files for the account pages (server-rendered, no build step).

The pages are Jinja2 templates with autoescaping on, one stylesheet, and one
small script (the copy button); no inline script, so the pages can be served
with a strict Content-Security-Policy.

May import: the top-level modules (`units`); the pages' data comes from `api`.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Optional

import jinja2

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"


def when(timestamp: Optional[float]) -> str:
    """A moment as people read it: '2024-05-01 14:03 UTC'."""
    if not timestamp:
        return "—"
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "—"
    seconds = float(seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def until(timestamp: Optional[float]) -> str:
    """How long from now until ``timestamp``: 'in 3 h'."""
    if not timestamp:
        return "never"
    left = timestamp - time.time()
    return "now" if left <= 0 else f"in {duration(left)}"


def size(value: Optional[int]) -> str:
    from ..units import format_size

    return "—" if value is None else format_size(value)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, duration=duration, until=until, size=size)
    return env

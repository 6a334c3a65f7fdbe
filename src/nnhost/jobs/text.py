"""What text from a job may look like once stored or logged.

A job's description and LOG lines come from user code (a traceback, a
``print``): they may hold characters the database or JSON cannot encode, or
line breaks that would forge lines of the operator's log. Both sides that
store or log them (the controller, the observers) clean them here, the same
way. Nothing here decides whether a text is accepted.
"""

from __future__ import annotations


def clean_text(text: str) -> str:
    """Text SQLite and JSON can hold: lone surrogates (which they cannot encode) replaced."""
    return text.encode("utf-8", "replace").decode("utf-8")


def one_line(text: str, limit: int = 200) -> str:
    """Text for a server log line: its first line, shortened, control characters escaped.

    Descriptions carry the user's own tracebacks; in the operator's log they must
    not be able to start a line of their own.
    """
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = first if len(first) <= limit else first[: limit - 3] + "..."
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in first)

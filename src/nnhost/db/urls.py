"""Which database a server uses, from the ``database`` setting: checked, then normalised.

Two kinds are accepted: a SQLite file (``sqlite:///PATH``, the default being
``DATA_DIR/nnhost.sqlite3``) and PostgreSQL (``postgresql://USER:PASSWORD@HOST:PORT/NAME``,
spoken through psycopg 3). Anything else is refused with a sentence that says
what to write instead; this module never guesses what a bad URL meant, and it
never puts a password in a message or a log line (`shown`).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

EXAMPLES = "sqlite:////var/lib/nnhost/nnhost.sqlite3 or postgresql://USER:PASSWORD@HOST:5432/NAME"
_POSTGRES_NAMES = ("postgresql", "postgres", "postgresql+psycopg")


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{Path(path).expanduser().resolve()}"


def check_url(text: str) -> str:
    """The URL in the form nnhost uses it; ValueError, saying what is accepted, otherwise."""
    text = text.strip()
    try:
        url = make_url(text)
    except ArgumentError:
        raise ValueError(f"not a database URL; use {EXAMPLES}") from None
    if url.drivername == "sqlite":
        if not url.database or url.database == ":memory:":
            raise ValueError(
                "an in-memory SQLite database would lose every job and key at exit; "
                "name a file: sqlite:////absolute/path/nnhost.sqlite3"
            )
        if url.query:
            raise ValueError("nnhost sets SQLite's options itself; remove the ?... part")
        return sqlite_url(Path(url.database))
    if url.drivername in _POSTGRES_NAMES:
        if not url.database:
            raise ValueError(
                "name the database after the host: postgresql://USER:PASSWORD@HOST:5432/NAME"
            )
        return url.set(drivername="postgresql").render_as_string(hide_password=False)
    if url.get_backend_name() in ("postgresql", "sqlite"):
        raise ValueError(
            f"the driver {url.drivername!r} is not the one nnhost uses; write "
            f"{url.get_backend_name()}://... (PostgreSQL goes through psycopg 3)"
        )
    raise ValueError(f"{url.drivername!r} databases are not supported; use {EXAMPLES}")


def engine_url(text: str) -> URL:
    """The SQLAlchemy URL to connect with (PostgreSQL through psycopg 3)."""
    url = make_url(check_url(text))
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url


def shown(url: URL | str) -> str:
    """The URL for messages and logs: the password masked."""
    if isinstance(url, str):
        try:
            url = make_url(url)
        except ArgumentError:
            return "<not a database URL>"
    return url.render_as_string(hide_password=True)

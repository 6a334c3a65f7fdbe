"""``nnhost users``, ``nnhost keys`` and ``nnhost invites``: the operator's account commands.

They work on the server's database directly (the one its ``--data-dir`` or
``--database`` names; SQLite in WAL mode or PostgreSQL, so they are safe to
run while the server is serving; a revoked key is refused
from the next request on). A new key or invite code is printed alone on
stdout, once, so a script can capture it; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import getpass
import sys
import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence

from ..auth.invites import InviteStore
from ..auth.keys import LOCAL_ADMIN_EMAIL as ADMIN_EMAIL
from ..auth.keys import KeyStore, User, UserExists, normalize_tags
from ..auth.passwords import hash_password, password_problem
from ..units import parse_duration
from .flags import add_setting_flags

if TYPE_CHECKING:
    from ..db import Database

    #: The ``nnhost`` parser's subcommands, as ``add_subparsers`` returns them.
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


def parse_expiry(text: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """A moment from '30d', '12h', '90m', '45s', '2w' (from now) or a date '2025-01-31'."""
    if not text or text.strip().lower() in ("never", "none"):
        return None
    now = time.time() if now is None else now
    try:
        # A bare number would be ambiguous here (seconds? a year?): a duration needs a unit.
        if text.strip()[-1:].isalpha():
            return now + parse_duration(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an expiry: use a duration like 30d, 12h, 90m, 2w, or a date "
            "like 2025-01-31"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def _when(timestamp: Optional[float]) -> str:
    if not timestamp:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M")


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
        for row in rows
    )


@contextlib.contextmanager
def _database(args: argparse.Namespace) -> Iterator["Database"]:
    from ..config import load_settings
    from ..db import DatabaseError, connect
    from .flags import given

    settings = load_settings(given(args))  # --data-dir, --database
    try:
        database = connect(settings.database_url)
    except DatabaseError as error:
        raise _Refusal(str(error)) from None
    try:
        yield database
    finally:
        database.close()


def _fail(message: str) -> int:
    print(f"nnhost: {message}", file=sys.stderr)
    return 1


class _Refusal(Exception):
    """A command cannot go on; `_command` prints it and exits 1."""


def _user(keys: KeyStore, email: str) -> User:
    user = keys.find_user(email)
    if user is None:
        raise _Refusal(f"there is no user {email}; see `nnhost users list`")
    return user


def _user_id(keys: KeyStore, email: Optional[str]) -> Optional[int]:
    """The id of the user ``email`` names, or None (every user) when it names none."""
    return _user(keys, email).id if email else None


def _read_password(email: str) -> str:
    """From the terminal (asked twice) or, when piped, the first line of stdin."""
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass(f"Password for {email}: ")
    if getpass.getpass("Again: ") != first:
        raise ValueError("the two passwords differ")
    return first


# -- users ---------------------------------------------------------------------------


def _users_add(args: argparse.Namespace) -> int:
    password_hash = None
    if args.password:
        try:
            password = _read_password(args.email)
        except ValueError as error:
            return _fail(str(error))
        problem = password_problem(password)
        if problem:
            return _fail(problem)
        password_hash = hash_password(password)
    with _database(args) as connection:
        keys = KeyStore(connection)
        try:
            keys.add_user(args.email, args.tag or (), password_hash=password_hash)
        except UserExists as error:
            return _fail(str(error))
        user = _user(keys, args.email)
    tags = ", ".join(user.tags) or "no tags"
    print(f"Added {user.email} ({tags}). Make a key: nnhost keys create --email {user.email}",
          file=sys.stderr)
    return 0


def _users_list(args: argparse.Namespace) -> int:
    with _database(args) as connection:
        keys = KeyStore(connection)
        users = keys.users()
        active: dict[int, int] = {}
        for info in keys.keys():
            if info.state() == "active":
                active[info.user_id] = active.get(info.user_id, 0) + 1
    rows = [("ID", "EMAIL", "TAGS", "STATE", "PASSWORD", "ACTIVE KEYS", "CREATED")]
    for user in users:
        rows.append((
            str(user.id), user.email, ",".join(user.tags) or "-",
            "disabled" if user.disabled else "active", "yes" if user.has_password else "no",
            str(active.get(user.id, 0)), _when(user.created_at),
        ))
    print(_table(rows))
    return 0


def _set_disabled(args: argparse.Namespace, disabled: bool) -> int:
    from ..auth.sessions import SessionStore

    with _database(args) as connection:
        keys = KeyStore(connection)
        user = _user(keys, args.email)
        keys.set_disabled(user.id, disabled)
        if disabled:
            SessionStore(connection, keys, ttl=0).end_all(user.id)
    word = "Disabled" if disabled else "Enabled"
    effect = ": their keys and web sessions stop working now" if disabled else ""
    print(f"{word} {user.email}{effect}.", file=sys.stderr)
    return 0


def _users_disable(args: argparse.Namespace) -> int:
    return _set_disabled(args, True)


def _users_enable(args: argparse.Namespace) -> int:
    return _set_disabled(args, False)


def _users_tags(args: argparse.Namespace) -> int:
    with _database(args) as connection:
        keys = KeyStore(connection)
        user = _user(keys, args.email)
        tags = set(args.set) if args.set is not None else set(user.tags)
        tags |= set(normalize_tags(args.add or ()))
        tags -= set(normalize_tags(args.remove or ()))
        keys.set_tags(user.id, tags)
        user = _user(keys, args.email)
    print(f"{user.email}: {', '.join(user.tags) or 'no tags'}", file=sys.stderr)
    return 0


def _users_password(args: argparse.Namespace) -> int:
    try:
        password = _read_password(args.email)
    except ValueError as error:
        return _fail(str(error))
    problem = password_problem(password)
    if problem:
        return _fail(problem)
    with _database(args) as connection:
        keys = KeyStore(connection)
        user = _user(keys, args.email)
        keys.set_password_hash(user.id, hash_password(password))
    print(f"Set the password of {user.email}.", file=sys.stderr)
    return 0


# -- keys ------------------------------------------------------------------------------


def _keys_create(args: argparse.Namespace) -> int:
    with _database(args) as connection:
        keys = KeyStore(connection)
        email = args.email or ADMIN_EMAIL
        user = keys.find_user(email)
        if user is None:
            user_id = keys.add_user(email, ("admin",) if email == ADMIN_EMAIL else ())
            print(f"Added the user {email}.", file=sys.stderr)
        elif user.disabled:
            return _fail(f"{email} is disabled; enable them first (nnhost users enable {email})")
        else:
            user_id = user.id
        key = keys.create_key(user_id, name=args.name or "cli", expires_at=args.expires)
    print(key)
    expiry = f", expires {_when(args.expires)} UTC" if args.expires else ""
    print(f"(a key for {email}{expiry}; shown once, stored hashed)", file=sys.stderr)
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    with _database(args) as connection:
        keys = KeyStore(connection)
        user_id = _user_id(keys, args.email)
        infos = keys.keys(user_id)
    rows = [("ID", "KEY", "OWNER", "NAME", "CREATED", "EXPIRES", "LAST USED", "STATE")]
    now = time.time()
    for info in infos:
        rows.append((
            str(info.id), info.prefix + "...", info.email, info.name or "-",
            _when(info.created_at), _when(info.expires_at) if info.expires_at else "never",
            _when(info.last_used_at), info.state(now),
        ))
    print(_table(rows))
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    with _database(args) as connection:
        keys = KeyStore(connection)
        user_id = _user_id(keys, args.email)
        matches = keys.find_keys(args.key, user_id)
        if not matches:
            return _fail(f"no key matches {args.key!r}; see `nnhost keys list`")
        if len(matches) > 1:
            listed = ", ".join(f"{m.id} ({m.prefix}..., {m.email})" for m in matches)
            return _fail(f"{args.key!r} matches several keys: {listed}; give its ID")
        info = matches[0]
        if not keys.revoke_key(info.id):
            print(f"Key {info.prefix}... of {info.email} was already revoked.", file=sys.stderr)
            return 0
    print(f"Revoked key {info.prefix}... of {info.email}; it is refused from now on.",
          file=sys.stderr)
    return 0


# -- invites ----------------------------------------------------------------------------


def _invites_create(args: argparse.Namespace) -> int:
    with _database(args) as connection:
        invites = InviteStore(connection)
        codes = [
            invites.create(args.tag or (), note=args.note or "", expires_at=args.expires)
            for _ in range(args.count)
        ]
    for code in codes:
        print(code)
    print(
        f"({len(codes)} invite code{'s' if len(codes) > 1 else ''}, one sign-up each; "
        "give one to each person with the sign-up page, /signup?invite=CODE)",
        file=sys.stderr,
    )
    return 0


def _invites_list(args: argparse.Namespace) -> int:
    with _database(args) as connection:
        invites = InviteStore(connection).all()
        emails = {user.id: user.email for user in KeyStore(connection).users()}
    rows = [("ID", "CODE", "TAGS", "NOTE", "CREATED", "EXPIRES", "STATE", "USED BY")]
    for invite in invites:
        rows.append((
            str(invite.id), invite.prefix + "...", ",".join(invite.tags) or "-",
            invite.note or "-", _when(invite.created_at),
            _when(invite.expires_at) if invite.expires_at else "never", invite.state(),
            emails.get(invite.used_by, "-") if invite.used_by else "-",
        ))
    print(_table(rows))
    return 0


# -- the parser ---------------------------------------------------------------------------


def _command(
    group: Subcommands, name: str, run: Callable[[argparse.Namespace], int], help: str
) -> argparse.ArgumentParser:
    parser = group.add_parser(name, help=help, description=help)
    add_setting_flags(parser, only=["data_dir", "database"])  # the server's own

    def reporting_refusals(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except _Refusal as refusal:
            return _fail(str(refusal))

    parser.set_defaults(run=reporting_refusals)
    return parser


def register(commands: Subcommands) -> None:
    """Add ``users``, ``keys`` and ``invites`` to the ``nnhost`` command's subparsers."""
    users = commands.add_parser("users", help="Manage user accounts.")
    user_commands = users.add_subparsers(dest="users_command", required=True)
    add = _command(user_commands, "add", _users_add, "Add a user.")
    add.add_argument("email")
    add.add_argument("--tag", action="append", help="a tag (admin, priority, trusted...); repeat")
    add.add_argument("--password", action="store_true",
                     help="also set a web password (asked, or read from stdin when piped)")
    _command(user_commands, "list", _users_list, "List users.")
    disable = _command(user_commands, "disable", _users_disable,
                       "Disable a user: their keys and web sessions stop working.")
    disable.add_argument("email")
    enable = _command(user_commands, "enable", _users_enable, "Enable a disabled user again.")
    enable.add_argument("email")
    tags = _command(user_commands, "tags", _users_tags, "Change a user's tags.")
    tags.add_argument("email")
    tags.add_argument("--add", action="append", metavar="TAG")
    tags.add_argument("--remove", action="append", metavar="TAG")
    tags.add_argument("--set", nargs="*", metavar="TAG", help="replace every tag with these")
    password = _command(user_commands, "password", _users_password,
                        "Set a user's web password (asked, or read from stdin when piped).")
    password.add_argument("email")

    keys = commands.add_parser("keys", help="Manage API keys.")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = _command(key_commands, "create", _keys_create, "Make a new key and print it (once).")
    create.add_argument("--email", default=None, help="the key's owner (default the admin)")
    create.add_argument("--name", default=None, help="a label to tell keys apart")
    create.add_argument("--expires", type=parse_expiry, default=None,
                        help="when it stops working: 30d, 12h, 2w, or a date (default never)")
    listing = _command(key_commands, "list", _keys_list, "List keys (by prefix; never the key).")
    listing.add_argument("--email", default=None, help="only this user's keys")
    revoke = _command(key_commands, "revoke", _keys_revoke, "Revoke a key, by ID or prefix.")
    revoke.add_argument("key", help="the key's ID or prefix, as `nnhost keys list` shows")
    revoke.add_argument("--email", default=None, help="only among this user's keys")

    invites = commands.add_parser("invites", help="Invite codes for invite-only sign-up.")
    invite_commands = invites.add_subparsers(dest="invites_command", required=True)
    make = _command(invite_commands, "create", _invites_create, "Make invite codes (printed once).")
    make.add_argument("--tag", action="append", help="a tag the new account gets; repeat")
    make.add_argument("--expires", type=parse_expiry, default=None,
                      help="when the code stops working: 7d, 12h, or a date (default never)")
    make.add_argument("--note", default=None, help="who it is for")
    make.add_argument("--count", type=int, default=1, help="how many codes")
    _command(invite_commands, "list", _invites_list, "List invite codes (by prefix).")

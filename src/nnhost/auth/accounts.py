"""Signing up, logging in and out: the rules behind the web pages.

Who may sign up is the operator's choice (``signup = "open" | "invite" |
"closed"``), and one address may make ``signups_per_address`` accounts an
hour. A password is checked against its argon2 hash; a wrong one counts
against the client's address and that account and against the address alone,
a wrong invite code against the address, and a source over the limit is
refused for a while (`Throttled`) before any hash is computed. Hashing is slow
on purpose: callers on an event loop run these methods in a thread
(`api.account_pages`). A successful sign-up or login starts a server-side
session (see `sessions`). Every refusal here is a
sentence the page can show as it is. Nothing here knows HTTP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..db import Database
from .access import Access, Throttled
from .invites import InviteStore
from .keys import KeyStore, Principal, UserExists, normalize_email
from .passwords import hash_password, needs_rehash, password_problem, verify_password
from .sessions import SessionStore

if TYPE_CHECKING:
    from ..config import Settings

_EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,190}$")


class AccountError(ValueError):
    """A sign-up or login that can't go through; the message says why, for the page."""


@dataclass(frozen=True)
class SignedIn:
    principal: Principal
    session_token: str


class Accounts:
    def __init__(
        self,
        settings: "Settings",
        database: Database,
        keys: KeyStore,
        access: Access,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.access = access
        self.sessions = SessionStore(database, keys, ttl=settings.session_ttl)
        self.invites = InviteStore(database)

    @property
    def signup_mode(self) -> str:
        return self.settings.signup

    def _check_address(self, address: str, source: Optional[str] = None) -> None:
        """Refuse an address (or its ``source``, address and account) over the failure limit."""
        wait = self.access.address_password_failures.blocked_for(address)
        if source is not None:
            wait = max(wait, self.access.password_failures.blocked_for(source))
        if wait > 0:
            raise Throttled(
                f"Too many failed attempts from your address. Wait {max(1, round(wait))} "
                "seconds before trying again.",
                wait,
            )

    def _record_failure(self, address: str, source: Optional[str] = None) -> None:
        self.access.address_password_failures.record(address)
        if source is not None:
            self.access.password_failures.record(source)

    def _check_signups(self, address: str) -> None:
        wait = self.access.signups.blocked_for(address)
        if wait > 0:
            raise Throttled(
                f"Your address has made {self.settings.signups_per_address} accounts in the "
                f"last hour, this server's limit. Try again in {max(1, round(wait / 60))} "
                "minutes, or ask its operator for an account.",
                wait,
            )

    def signup(self, email: str, password: str, invite_code: str, address: str) -> SignedIn:
        if self.signup_mode == "closed":
            raise AccountError(
                "This server does not take sign-ups. Ask its operator for an account."
            )
        self._check_address(address)
        self._check_signups(address)
        email = normalize_email(email)
        if not _EMAIL.match(email):
            raise AccountError("Enter an email address, like ada@example.org.")
        problem = password_problem(password)
        if problem:
            raise AccountError(problem)
        invite = None
        if self.signup_mode == "invite":
            invite = self.invites.claim(invite_code)
            if invite is None:
                self._record_failure(address)
                raise AccountError(
                    "That invite code is not valid (unknown, used or expired). "
                    "Ask the server's operator for a new one."
                )
        try:
            user_id = self.keys.add_user(
                email, invite.tags if invite else (), password_hash=hash_password(password)
            )
        except UserExists:
            if invite is not None:
                self.invites.release(invite.id)
            raise AccountError(f"There is already an account for {email}. Log in instead.") from None
        if invite is not None:
            self.invites.bind(invite.id, user_id)
        self.access.signups.record(address)
        principal = self.keys.principal(user_id)
        assert principal is not None  # the account just made, and not disabled
        return SignedIn(principal, self.sessions.create(user_id))

    def login(self, email: str, password: str, address: str) -> SignedIn:
        # Passwords can be guessed, so a source over the limit is refused before
        # the check (else the right guess would tell), and before the hash is
        # paid for. Two counts: this address and account (guessing one account
        # does not lock others out), and this address whatever the account (a
        # new email each time is no way around the first). Neither reaches
        # another address: the right password from elsewhere always works.
        source = f"{address} {normalize_email(email)}"
        self._check_address(address, source)
        record = self.keys.login_record(email)
        stored = record[1] if record else None
        # Always run the hash, so an unknown email takes as long as a wrong password.
        if not verify_password(stored, password) or record is None:
            self._record_failure(address, source)
            raise AccountError("That email and password don't match an account here.")
        principal, stored, disabled = record
        if disabled:
            raise AccountError("This account is disabled. Ask the server's operator.")
        assert stored is not None  # verify_password matched it
        if needs_rehash(stored):
            self.keys.set_password_hash(principal.user_id, hash_password(password))
        return SignedIn(principal, self.sessions.create(principal.user_id))

    def logout(self, session_token: str) -> None:
        self.sessions.end(session_token)

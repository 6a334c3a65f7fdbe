"""Who a request acts for, and whether they may send it now.

`Access` is what the API asks before it does anything for a caller: it checks
the API key (or, with ``auth = "none"``, treats every caller as the local
admin), counts unknown keys per client address and answers an address that
keeps guessing with 429 (a valid key from it still works), and holds each user to the limits of their tags. It raises
`Throttled` with the seconds to wait; the API turns that into a 429 with
``Retry-After``. It knows nothing of HTTP.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Callable, Optional

from .keys import KeyCheck, KeyProblem, KeyStore, Principal
from .limits import (
    FailureCounter,
    LimitPolicy,
    Limits,
    LimitsConfigError,
    RequestRate,
    describe,
)

if TYPE_CHECKING:
    from ..config import Settings

AUTH_MODES = ("keys", "none")
SIGNUP_MODES = ("open", "invite", "closed")


class Throttled(Exception):
    """Refused for now; ``retry_after`` seconds from now it may work."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def settings_problem(settings: "Settings") -> Optional[str]:
    """Why these auth settings can't be served, in words for the operator, or None."""
    if settings.auth not in AUTH_MODES:
        return f"auth must be one of {', '.join(AUTH_MODES)}, not {settings.auth!r}."
    if settings.signup not in SIGNUP_MODES:
        return f"signup must be one of {', '.join(SIGNUP_MODES)}, not {settings.signup!r}."
    try:
        LimitPolicy(settings.limits, max_request_bytes=settings.max_request_bytes)
    except LimitsConfigError as error:
        return f"nnhost.toml: {error}."
    if settings.auth == "none" and not settings.allow_insecure and not is_loopback(settings.host):
        return (
            f"Refusing to serve {settings.host} with --auth none: anyone who can reach this "
            "address would act as the admin, with no key. Bind a loopback address "
            "(--host 127.0.0.1, the default), or keep API keys on (drop --auth none), or, "
            "if every machine that can reach this address is yours, add --allow-insecure."
        )
    return None


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _failure_detail(what: str, seconds: float) -> str:
    return (
        f"Too many failed {what} from your address. Wait {max(1, round(seconds))} seconds "
        "before trying again, and check that you are using the right one."
    )


class Access:
    def __init__(
        self,
        settings: "Settings",
        keys: KeyStore,
        *,
        local_admin_email: str,
        unfinished_jobs: Callable[[int], int],
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.open = settings.auth == "none"
        self.policy = LimitPolicy(settings.limits, max_request_bytes=settings.max_request_bytes)
        limit, window = settings.auth_failure_limit, settings.auth_failure_window
        # In the Redis the API processes share (``events`` is always one), if any:
        # every process then counts the same requests and attempts.
        shared = settings.events or None
        self.rate = RequestRate(redis_url=shared)
        self.key_failures = FailureCounter(limit, window, redis_url=shared, name="key-failures")
        #: Wrong passwords per address and account, and per address whatever the account
        #: (so naming a new email each time does not start a new count).
        self.password_failures = FailureCounter(limit, window, redis_url=shared, name="password-failures")
        self.address_password_failures = FailureCounter(
            limit, window, redis_url=shared, name="address-password-failures"
        )
        #: Accounts made per address in the last hour (counted like failures: a sliding window).
        self.signups = FailureCounter(settings.signups_per_address, 3600.0, redis_url=shared, name="signups")
        self._unfinished_jobs = unfinished_jobs
        self.local_admin: Optional[Principal] = None
        if self.open:
            admin = keys.user_by_email(local_admin_email)
            if admin is None:
                keys.add_user(local_admin_email, ("admin",))
                admin = keys.user_by_email(local_admin_email)
            self.local_admin = admin

    # -- who -------------------------------------------------------------------

    def authenticate(self, key: Optional[str], address: str) -> KeyCheck:
        """Check a key sent from ``address``; `Throttled` for a failure from an address that keeps failing.

        A valid key always works, whatever its address did before: keys are
        random and long, so guessing cannot find one, and refusing the right
        key would let anyone behind the same address (a NAT, a proxy) lock its
        owner out. What the counter slows is further failures from that address.
        """
        if self.open:
            return KeyCheck(principal=self.local_admin)
        check = self.keys.check(key)
        # Only unknown keys are guesses. A revoked or expired key is a real one someone
        # forgot to replace; counting it would let one stale script throttle everyone
        # behind the same address.
        if check.problem is KeyProblem.UNKNOWN:
            wait = self.key_failures.blocked_for(address)
            self.key_failures.record(address)
            if wait > 0:
                raise Throttled(_failure_detail("API keys", wait), wait)
        return check

    def identify(self, key: Optional[str]) -> Optional[Principal]:
        """The key's owner or None, without counting (for routes that work anonymously)."""
        if self.open:
            return self.local_admin
        return self.keys.check(key).principal

    # -- how much ----------------------------------------------------------------

    def limits(self, principal: Principal) -> Limits:
        return self.policy.for_tags(principal.tags)

    def admit(self, principal: Principal) -> Limits:
        """Let one more request in for ``principal`` or raise `Throttled`; returns their limits."""
        limits = self.limits(principal)
        if limits.queued_jobs:
            unfinished = self._unfinished_jobs(principal.user_id)
            if unfinished >= limits.queued_jobs:
                raise Throttled(
                    f"You already have {_count(unfinished, 'request')} waiting or running, "
                    f"the most this server takes from your account at once ({describe(limits)}). "
                    "Wait for one to finish, then send this again.",
                    5.0,
                )
        wait = self.rate.take(principal.user_id, limits)
        if wait > 0:
            raise Throttled(
                f"Too many requests: your account may send {describe(limits)}. "
                f"Try again in {max(1, round(wait))} seconds.",
                wait,
            )
        return limits

"""What one user may ask of the server, and counting attempts that failed.

Limits are set by the operator per user tag, in ``nnhost.toml``::

    [limits.default]          # everyone
    requests_per_minute = 120
    queued_jobs = 16
    [limits.priority]         # users tagged "priority"
    requests_per_minute = 600
    burst = 50
    queued_jobs = 64
    request_bytes = "1GiB"

A field a user's tags don't set comes from ``default``; when several of a
user's tags set it, the most generous wins; ``0`` means "no limit" (for
``request_bytes``: the server's ``max_request_bytes``). Limits apply to the
user, whichever of their keys they use, so making more keys buys nothing.

Requests per minute is a token bucket (``burst`` requests at once, refilled at
the per-minute rate); a refusal tells how long until the next token. Failed
key and password attempts are counted per source (a client address; for
passwords, an address and account) in a sliding window; a source over the
limit has its further failures refused until its oldest counted failure ages
out. Both live in Redis when the server has one (``events``), so that
several API processes give a user one allowance and a source one count.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Mapping, Optional

from ..units import format_size, parse_size

MiB = 1024 * 1024

_log = logging.getLogger("nnhost.limits")


@dataclass(frozen=True)
class Limits:
    #: Sustained requests a minute to /request (0: no limit).
    requests_per_minute: float = 0
    #: Requests that may come at once before the per-minute rate applies (0: one minute's worth).
    burst: int = 0
    #: Jobs waiting or running at once (0: no limit).
    queued_jobs: int = 0
    #: Largest request body in bytes (0: the server's max_request_bytes).
    request_bytes: int = 0

    @property
    def capacity(self) -> float:
        return float(self.burst or max(1, math.ceil(self.requests_per_minute)))


FIELDS = tuple(f.name for f in fields(Limits))

#: What applies when the operator says nothing: generous for people, none for admins.
BUILTIN: dict[str, dict[str, Any]] = {
    "default": {"requests_per_minute": 120, "queued_jobs": 16},
    "admin": {"requests_per_minute": 0, "queued_jobs": 0},
}

class LimitsConfigError(ValueError):
    """The operator's limits tables can't be read; the message says which entry."""


def _number(tag: str, name: str, value: Any) -> float:
    if name == "request_bytes":
        try:
            return float(parse_size(value))
        except ValueError as error:
            raise LimitsConfigError(f"[limits.{tag}] {name}: {error}") from None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise LimitsConfigError(f"[limits.{tag}] {name} = {value!r} is not a number") from None
    if number < 0:
        raise LimitsConfigError(f"[limits.{tag}] {name} must not be negative (0 means no limit)")
    return number


class LimitPolicy:
    """The limits of each combination of tags, from the operator's tables."""

    def __init__(
        self, tables: Optional[Mapping[str, Any]] = None, *, max_request_bytes: int
    ) -> None:
        if isinstance(tables, str):
            try:
                tables = json.loads(tables) if tables.strip() else {}
            except ValueError:
                raise LimitsConfigError("limits must be TOML tables or a JSON object") from None
        merged: dict[str, dict[str, float]] = {tag: dict(t) for tag, t in BUILTIN.items()}
        for tag, table in (tables or {}).items():
            if not isinstance(table, Mapping):
                raise LimitsConfigError(
                    f"limits.{tag} must be a table of {', '.join(FIELDS)} (e.g. [limits.{tag}])"
                )
            for name, value in table.items():
                if name not in FIELDS:
                    raise LimitsConfigError(
                        f"[limits.{tag}] has an unknown setting {name!r}; "
                        f"known: {', '.join(FIELDS)}"
                    )
                merged.setdefault(tag.strip().lower(), {})[name] = _number(tag, name, value)
        self.tables = merged
        self.max_request_bytes = max_request_bytes
        self._cache: dict[tuple[str, ...], Limits] = {}

    def for_tags(self, tags: Iterable[str]) -> Limits:
        key = tuple(sorted(set(tags)))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        values: dict[str, float] = {}
        for name in FIELDS:
            candidates = [self.tables[tag][name] for tag in key if name in self.tables.get(tag, {})]
            if not candidates:
                values[name] = self.tables["default"].get(name, 0)
            elif name == "request_bytes":
                values[name] = max(c or self.max_request_bytes for c in candidates)
            else:
                values[name] = 0 if 0 in candidates else max(candidates)
        limits = Limits(
            requests_per_minute=values["requests_per_minute"],
            burst=int(values["burst"]),
            queued_jobs=int(values["queued_jobs"]),
            request_bytes=int(values["request_bytes"] or self.max_request_bytes),
        )
        self._cache[key] = limits
        return limits


#: One user's token bucket in Redis, taken atomically: refill by the time passed
#: (Redis's own clock, so API processes' clocks need not agree), then spend one
#: token or answer the wait. Returned as text: Redis would truncate a number.
_TAKE_SCRIPT = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local rate, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(state[1]), tonumber(state[2])
if tokens == nil or at == nil then tokens, at = capacity, now end
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) + 1)
return tostring(wait)
"""


@functools.lru_cache(maxsize=None)
def _redis(url: str) -> Any:
    """One client (one connection pool) per Redis URL, shared by every counter."""
    import redis

    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


class _SharedScript:
    """A Lua script run in Redis for one kind of count; None when Redis cannot answer.

    The caller then counts in its own process, which the warning says.
    """

    def __init__(self, url: str, source: str, what: str) -> None:
        self._script = _redis(url).register_script(source)
        self._what = what

    def __call__(self, key: str, *args: Any) -> Optional[float]:
        import redis

        try:
            return float(self._script(keys=[key], args=list(args)))
        except (redis.RedisError, ValueError) as error:
            _log.warning("%s fall back to this process: Redis said %s", self._what, error)
            return None


class RequestRate:
    """Token buckets, one per user: how long until they may send another request.

    In this process, or, given a Redis URL (the server's ``events``, shared by
    its API processes), in Redis: then every API process spends from the same
    bucket, and a user gets one allowance however many processes serve them.
    If Redis cannot be reached the bucket of this process is used, and said.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, redis_url: Optional[str] = None) -> None:
        self._clock = clock
        self._buckets: dict[Any, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._shared = _SharedScript(redis_url, _TAKE_SCRIPT, "request rates") if redis_url else None

    @property
    def shared(self) -> bool:
        """Whether the buckets are in Redis, shared with the other API processes."""
        return self._shared is not None

    def take(self, subject: Any, limits: Limits) -> float:
        """Spend one token and return 0, or return the seconds to wait (spending nothing)."""
        if not limits.requests_per_minute:
            return 0.0
        rate = limits.requests_per_minute / 60.0
        capacity = limits.capacity
        if self._shared is not None:
            wait = self._shared(f"nnhost:rate:{subject}", rate, capacity)
            if wait is not None:
                return wait
        now = self._clock()
        with self._lock:
            tokens, then = self._buckets.get(subject, (capacity, now))
            tokens = min(capacity, tokens + (now - then) * rate)
            if tokens >= 1.0:
                self._buckets[subject] = (tokens - 1.0, now)
                if len(self._buckets) > 10_000:
                    self._forget_full(now, rate, capacity)
                return 0.0
            self._buckets[subject] = (tokens, now)
            return (1.0 - tokens) / rate

    def _forget_full(self, now: float, rate: float, capacity: float) -> None:
        for subject, (tokens, then) in list(self._buckets.items()):
            if tokens + (now - then) * rate >= capacity:
                del self._buckets[subject]


#: A sliding window of attempts in Redis (a sorted set of times, by Redis's own
#: clock): ARGV[1] "record" adds one, "check" answers the seconds to wait.
_WINDOW_SCRIPT = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local limit, window = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if ARGV[1] == 'record' then
  redis.call('ZADD', KEYS[1], now, tostring(now) .. ':' .. ARGV[4])
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(limit + 1))
  redis.call('EXPIRE', KEYS[1], math.ceil(window) + 1)
  return '0'
end
if redis.call('ZCARD', KEYS[1]) < limit then return '0' end
local oldest = redis.call('ZRANGE', KEYS[1], -limit, -limit, 'WITHSCORES')
return tostring(math.max(0, tonumber(oldest[2]) + window - now))
"""


class FailureCounter:
    """Attempts per source (a client address, or address and account) in a sliding window.

    In this process, or, given a Redis URL (the server's ``events``), in Redis
    under ``name``, so that every API process counts the same attempts. If
    Redis cannot be reached this process's own count is used, and said.
    """

    def __init__(
        self, limit: int, window: float, clock: Callable[[], float] = time.monotonic,
        *, redis_url: Optional[str] = None, name: str = "failures",
    ) -> None:
        self.limit = limit
        self.window = window
        self.name = name
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._script = _SharedScript(redis_url, _WINDOW_SCRIPT, f"{name} counts") if redis_url else None

    def _shared(self, action: str, address: str) -> Optional[float]:
        """Ask Redis; None when there is no Redis or it cannot answer (then count here)."""
        if self._script is None:
            return None
        return self._script(f"nnhost:{self.name}:{address}", action, self.limit, self.window,
                            secrets.token_hex(4))

    def _recent(self, address: str, now: float) -> deque[float]:
        # Only the newest `limit` failures decide a block, so a source that keeps
        # failing costs `limit` timestamps, not one per attempt.
        failures = self._failures.get(address)
        if failures is None:
            return deque()
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            del self._failures[address]
        return failures

    def blocked_for(self, address: str) -> float:
        """Seconds until ``address`` may try again (0: it may now)."""
        if self.limit <= 0:
            return 0.0
        shared = self._shared("check", address)
        if shared is not None:
            return shared
        now = self._clock()
        with self._lock:
            failures = self._recent(address, now)
            if len(failures) < self.limit:
                return 0.0
            return failures[-self.limit] + self.window - now

    def record(self, address: str) -> None:
        if self.limit <= 0:
            return
        if self._shared("record", address) is not None:
            return
        now = self._clock()
        with self._lock:
            self._recent(address, now)
            self._failures.setdefault(address, deque(maxlen=self.limit)).append(now)
            if len(self._failures) > 10_000:
                for other in list(self._failures):
                    self._recent(other, now)


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


def describe(limits: Limits) -> str:
    """The limits in a sentence, for refusals and the account page."""
    parts = []
    if limits.requests_per_minute:
        rate = f"{limits.requests_per_minute:g} requests a minute"
        if limits.burst:
            rate += f" (up to {limits.burst} at once)"
        parts.append(rate)
    if limits.queued_jobs:
        plural = "" if limits.queued_jobs == 1 else "s"
        parts.append(f"{limits.queued_jobs} request{plural} waiting or running at once")
    parts.append(f"requests of up to {format_size(limits.request_bytes)}")
    return ", ".join(parts)

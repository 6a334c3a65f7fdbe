"""Password hashing for the web pages: argon2id, from argon2-cffi.

Unlike API keys (random, 256 bits), passwords are chosen by people and can be
guessed, so they get a slow, memory-hard hash with a per-password salt. The
clear password lives only in the request that carries it; it is never logged
or stored.
"""

from __future__ import annotations

from typing import Optional

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

#: Shortest password accepted at sign-up.
MIN_LENGTH = 8
MAX_LENGTH = 1024

# argon2-cffi's defaults (RFC 9106's "low memory" profile): ~50 ms and 64 MiB a hash.
_hasher = PasswordHasher()

# Checked against when the email is unknown, so a login takes as long whether or
# not the account exists (an attacker can't tell them apart by timing).
_DUMMY_HASH = _hasher.hash("nnhost: no such account")


def password_problem(password: str) -> Optional[str]:
    """Why a new password is not acceptable, or None."""
    if len(password) < MIN_LENGTH:
        return f"Choose a password of at least {MIN_LENGTH} characters."
    if len(password) > MAX_LENGTH:
        return f"Choose a password of at most {MAX_LENGTH} characters."
    return None


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(stored_hash: Optional[str], password: str) -> bool:
    """True when ``password`` matches; a missing hash never matches (and takes as long)."""
    try:
        return _hasher.verify(stored_hash or _DUMMY_HASH, password) and stored_hash is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def needs_rehash(stored_hash: str) -> bool:
    """True when the hash was made with weaker parameters than today's."""
    try:
        return _hasher.check_needs_rehash(stored_hash)
    except InvalidHashError:
        return True

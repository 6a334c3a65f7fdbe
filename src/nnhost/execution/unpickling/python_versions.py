"""What a payload from a client on another Python records that this Python would not.

nnsight ships a user's functions as source, but a class from the user's script
travels as cloudpickle writes it on the client's Python, and each Python
records a little more about some classes than the one before. A dataclass's
parameters (``__dataclass_params__``) gained ``match_args``, ``kw_only``,
``slots`` and ``weakref_slot`` in 3.12; its fields gained ``kw_only`` in 3.10
and ``doc`` in 3.14. Set on this server's objects as they come, a name its
Python lacks fails the whole request ("'_DataclassParams' object has no
attribute 'match_args'"), and a name it has but the client's lacked stays unset.

`translate_state` reads such a ``BUILD`` the way this server's Python would
have written it: a record the server's Python does not read is dropped (the
class's methods, made on the client, came with the payload), and one it reads
but the client's Python did not write gets the value that Python's behaviour
implied. What it cannot translate is refused by `cannot_express`, naming the
construct and both Pythons. Only the classes listed here are translated; this
module never lets a payload set anything the listed classes would not take.
"""

from __future__ import annotations

import platform
from typing import Any

from .allowlist import RefusedPayload

#: For each class whose instances a payload fills in, the attributes some Python
#: records and another lacks, and the value each means when it is not recorded.
#: None of them changes what a program sees: they describe how the class was
#: made (its methods travel with it), and no Python's dataclasses read them
#: back except to make a subclass, where the value below is what it assumes.
RECORDS: dict[tuple[str, str], dict[str, Any]] = {
    ("dataclasses", "_DataclassParams"): {
        "match_args": True, "kw_only": False, "slots": False, "weakref_slot": False,
    },
    ("dataclasses", "Field"): {"kw_only": False, "doc": None},
}


def server_python() -> str:
    return platform.python_version()


def _release(version: str) -> tuple[int, ...]:
    """``3.12.1`` -> ``(3, 12)``: the minor release, which decides what a Python records."""
    parts = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _minor(version: str) -> str:
    return ".".join(str(part) for part in _release(version))


def same_release(client_python: str) -> bool:
    """Whether ``client_python`` (``3.12.1``) is this server's Python, to the minor release."""
    return _release(client_python) == _release(server_python())


def syntax_note(client_python: str) -> str:
    """What to add to a shipped source's syntax error when the client's Python is newer.

    A ``def first[T](...)`` or a ``type X = ...`` from Python 3.12 is not
    Python to a 3.11 server: the source the client's Python compiled, this
    one cannot.
    """
    if not client_python or _release(client_python) <= _release(server_python()):
        return ""
    return (
        f" (your client runs Python {client_python}, and Python {server_python()} on this server "
        f"cannot read its newer syntax: write this the way Python {_minor(server_python())} can)"
    )


def _records_of(target: Any) -> dict[str, Any] | None:
    cls = type(target)
    return RECORDS.get((cls.__module__, cls.__qualname__))


def _slots_of(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.update((slots,) if isinstance(slots, str) else slots)
    return names


def translate_state(target: Any, state: Any) -> Any:
    """``state`` for ``BUILD`` into ``target``, as this Python records it.

    Unchanged for a class `RECORDS` does not list. For one it lists: the
    records this Python lacks are dropped, and the ones the client's Python
    did not write are filled in with what they meant there. Anything else the
    state names is left for ``BUILD`` to set (and `cannot_express` to refuse).
    """
    records = _records_of(target)
    if records is None:
        return state
    if isinstance(state, tuple) and len(state) == 2:
        attributes, slot_state = state
    else:
        attributes, slot_state = state, None
    if not isinstance(slot_state, dict) or (attributes is not None and not isinstance(attributes, dict)):
        return state  # not what a Python writes: BUILD refuses or fails as it would
    here = _slots_of(type(target))
    translated = {
        name: value for name, value in slot_state.items()
        if name in here or name not in records
    }
    for name, meant in records.items():
        if name in here and name not in translated:
            translated[name] = meant
    return (attributes, translated)


def cannot_express(target: Any, error: AttributeError, client_python: str) -> RefusedPayload:
    """The refusal for a ``BUILD`` that sets what this Python's class cannot hold."""
    cls = type(target)
    construct = f"{cls.__module__}.{cls.__qualname__}"
    attribute = getattr(error, "name", None) or str(error)
    made_on = f"Python {client_python}" if client_python else "your client's Python"
    return RefusedPayload(
        f"Your request's payload was made on {made_on} and sets {attribute!r} on a "
        f"{construct}, which Python {server_python()} on this server does not have. "
        f"Run your client on Python {_minor(server_python())}, or do without "
        "that feature of your Python in the code you send."
    )

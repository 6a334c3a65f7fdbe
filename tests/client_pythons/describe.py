"""A saved value as plain data, the same on every Python: what a result is compared by.

The requests of `record.py` were made by real clients on other Pythons, and
their local results were recorded there; the test that replays a request
reads the server's result on the test's own Python. A class of the user's
script exists only in the client's process, so the recording cannot carry
the value itself: it carries this description of it, and the test describes
what the server sent back the same way.

``deep`` also records what a class made during the run must keep (a named
tuple's fields, a dataclass's fields, an enum's members). A class shipped
from the client's script comes back as the id the client knows it by, which
only that client's process can resolve: for those, the name and the values
are what a replay can check.

Must import on every client Python (3.9 and later) with torch alone.
"""

from __future__ import annotations

import dataclasses
import enum


def describe(value, deep=True):
    import torch

    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.detach().clone())
    kind = type(value)
    name = kind.__qualname__
    if isinstance(value, enum.Enum):  # before int: an IntEnum's member is one
        members = [member.name for member in kind] if deep else None
        return ("enum", name, value.name, describe(value._value_, deep), members)
    if value is None:
        return ("NoneType", None)
    for plain in (bool, int, float, complex, str, bytes):
        if isinstance(value, plain):
            # Held as the plain type: the description must load where the class does not exist.
            return (name, plain(value))
    if isinstance(value, type):
        return ("class", value.__qualname__)
    if isinstance(value, dict):
        return ("dict", name, [(describe(k, deep), describe(v, deep)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        fields = tuple(getattr(kind, "_fields", ())) if deep else None
        return ("sequence", name, fields, [describe(item, deep) for item in value])
    if deep and dataclasses.is_dataclass(value):
        return ("dataclass", name, [(f.name, describe(getattr(value, f.name), deep)) for f in dataclasses.fields(value)])
    attributes = dict(getattr(value, "__dict__", {}))
    for klass in kind.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                attributes[slot] = getattr(value, slot)
    return ("object", name, sorted((key, describe(item, deep)) for key, item in attributes.items()))


def same(a, b, path="value"):
    """``a`` and ``b`` are descriptions of equal values (floats and tensors close)."""
    import math

    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), f"{path}: {a!r} != {b!r}"
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=path)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), f"{path}: {a} != {b}"
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for index, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{index}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"

"""A payload from a client on another Python names the same things differently.

A named tuple class shipped by value (cloudpickle) carries its field
accessors as ``_tuplegetter`` objects, which Python up to 3.11 writes as
``_collections._tuplegetter`` and 3.12 as ``collections._tuplegetter``. The
server read only the first: every script with a named tuple, a dataclass
or an enum of the user's own, sent from Python 3.12, was refused (seen when
the GPU check ran its parity programs under 3.12). Both names now read alike.
"""

from __future__ import annotations

import collections
import io

import cloudpickle
import pytest

from nnhost.execution.python_layer.sandbox import SandboxPolicy
from nnhost.execution.unpickling.unpickler import RefusedPayload, restricted_unpickler


def _refusal(data: bytes) -> str:
    with pytest.raises(RefusedPayload) as refused:
        restricted_unpickler(SandboxPolicy())(io.BytesIO(data)).load()
    return str(refused.value)


def test_a_named_tuple_from_python_3_12_reads_as_one_from_3_11() -> None:
    Point = collections.namedtuple("Point", ["x", "y"])
    Point.__module__ = "__main__"  # a class of the user's script: shipped by value
    # Protocol 3 writes globals as text lines, so the module's name can be swapped in place
    # (from whichever spelling the Python running the tests writes).
    old, new = b"c_collections\n_tuplegetter\n", b"ccollections\n_tuplegetter\n"
    here = cloudpickle.dumps(Point(1, 2), protocol=3)
    assert here.count(old) + here.count(new) == 1
    from_311, from_312 = here.replace(new, old), here.replace(old, new)

    # Neither is a trace, so both end at the top-level check, past the class definition.
    assert "_tuplegetter" not in _refusal(from_311)
    assert _refusal(from_312) == _refusal(from_311)


def test_other_private_names_of_collections_stay_refused() -> None:
    data = b"ccollections\n_count_elements\n."
    assert "private names are not accepted" in _refusal(data)

"""What one Python records in a payload and another lacks: translated, or refused by name.

The real clients' payloads are replayed in `test_client_pythons`; these
tests pin each rule of `execution.unpickling.python_versions` on payloads made here.
"""

from __future__ import annotations

import dataclasses
import io
import pickle

import pytest

from nnhost.execution.python_layer.sandbox import SandboxPolicy
from nnhost.execution.unpickling.python_versions import server_python, translate_state
from nnhost.execution.unpickling.unpickler import RefusedPayload, restricted_unpickler


def _filled(module, name, slots):
    """A payload that makes an empty ``module.name`` and fills it with ``slots``, as cloudpickle writes one."""
    state = pickle.dumps((None, slots), protocol=2)[2:-1]  # PROTO first, STOP last
    return b"\x80\x04c" + f"{module}\n{name}\n".encode() + b")\x81" + state + b"b."


def _load(data, client_python=""):
    unpickler = restricted_unpickler(SandboxPolicy())
    if client_python:
        unpickler = unpickler.for_client(client_python)
    return unpickler(io.BytesIO(data)).load()


def test_a_dataclass_from_python_3_12_drops_what_3_11_does_not_record():
    params = dataclasses._DataclassParams.__new__(dataclasses._DataclassParams)
    later = {"match_args": False, "kw_only": True, "slots": True, "weakref_slot": False}
    state = (None, {"init": True, "repr": True, "eq": True, "order": False,
                    "unsafe_hash": False, "frozen": True, **later})
    attributes, slots = translate_state(params, state)
    here = set(dataclasses._DataclassParams.__slots__)
    assert set(slots) == here and slots["frozen"] is True
    for name, value in later.items():
        assert slots.get(name, value) == value  # kept where this Python records it


def test_a_field_from_python_3_9_gets_what_its_kw_only_meant():
    field = dataclasses.Field.__new__(dataclasses.Field)
    _, slots = translate_state(field, (None, {"name": "x", "default": 1}))
    assert slots["kw_only"] is False and slots["name"] == "x"


def test_a_class_not_listed_is_left_alone():
    state = (None, {"anything": 1})
    assert translate_state(object(), state) is state


def test_what_this_python_cannot_hold_is_refused_naming_both_pythons():
    payload = _filled("dataclasses", "Field", {"name": "x", "novelty": 1})
    with pytest.raises(RefusedPayload) as refused:
        _load(payload, client_python="3.99.0")
    message = str(refused.value)
    assert "Python 3.99.0" in message and f"Python {server_python()}" in message
    assert "'novelty'" in message and "dataclasses.Field" in message


def test_a_record_of_a_later_python_is_dropped_before_the_load_goes_on():
    # Python 3.14 records a field's doc; the load reaches the payload's shape check.
    with pytest.raises(RefusedPayload) as refused:
        _load(_filled("dataclasses", "Field", {"name": "x", "doc": "the x"}), client_python="3.14.0")
    assert "not an nnsight trace" in str(refused.value)


def test_a_python_313_dataclass_names_what_earlier_pythons_spell_otherwise():
    import _thread

    for module, name in (("dataclasses", "_replace"), ("_thread", "get_ident")):
        data = b"\x80\x04c" + module.encode() + b"\n" + name.encode() + b"\n."
        with pytest.raises(RefusedPayload) as refused:
            restricted_unpickler(SandboxPolicy())(io.BytesIO(data)).load()
        assert "not an nnsight trace" in str(refused.value)  # named, then the shape check
    assert _thread.get_ident  # the stand-in's target exists here


def test_the_clients_python_is_read_from_its_header_only_when_it_is_a_release():
    from starlette.requests import Request

    from nnhost.api.deps import client_python

    def sent(value):
        return client_python(Request({"type": "http", "headers": [(b"python-version", value.encode())]}))

    assert sent("3.12.1 (main, Dec  6 2026, 01:00:00) [GCC 12.2.0]") == "3.12.1"
    assert sent("3.14.0rc2 (main)") == "3.14.0rc2"
    assert sent("'; DROP TABLE jobs") == ""
    assert sent("") == ""


def test_a_name_of_a_newer_python_is_refused_naming_both_pythons():
    data = b"\x80\x04ctyping\nNoSuchConstructYet\n."
    with pytest.raises(RefusedPayload) as refused:
        _load(data, client_python="3.99.1")
    message = str(refused.value)
    assert "typing.NoSuchConstructYet" in message
    assert f"Python {server_python()} on this server has no such name" in message
    assert "Python 3.99.1" in message
    with pytest.raises(RefusedPayload) as refused:
        _load(data)
    assert "no such name on this server" in str(refused.value)


def test_syntax_of_a_newer_python_is_refused_naming_both_pythons():
    from nnhost.execution.python_layer.sandbox import SandboxViolation, check_source
    from nnhost.execution.unpickling.python_versions import syntax_note

    source = "def first[T](items: list[T]) -> T:\n    return items[0]\n"  # Python 3.12's generics
    newer = "3.99.0"
    try:
        compile(source, "<here>", "exec")
    except SyntaxError:
        with pytest.raises(SandboxViolation) as refused:
            check_source(source, "[first:3] script.py", SandboxPolicy(), syntax_note(newer))
        message = str(refused.value)
        assert "[first:3] script.py, line 1" in message
        assert f"Python {newer}" in message and f"Python {server_python()} on this server" in message
    assert syntax_note(server_python()) == "" and syntax_note("3.1.0") == "" and syntax_note("") == ""


def test_a_name_of_the_script_sent_without_its_value_says_what_to_write_instead():
    # What cloudpickle writes for a 3.12 `type Pair = tuple[int, int]` in the user's script.
    with pytest.raises(RefusedPayload) as refused:
        _load(b"\x80\x04c__main__\nPair\n.", client_python="3.12.1")
    message = str(refused.value)
    assert "__main__.Pair" in message and "`type X = ...`" in message and "`X = ...`" in message

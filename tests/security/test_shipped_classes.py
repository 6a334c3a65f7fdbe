"""Classes shipped by value: the wider deserializer opens no way out.

The server accepts what cloudpickle writes for a user's class (descriptors,
dataclasses, named tuples, enums, exceptions, ``nn.Module`` subclasses) and
rebuilds it in the job's contained process. Each case here is a class a
stranger could ship through the real client; each must end in a refusal that
names what was refused, and the ``serving`` fixture then checks that the next
normal request gives the same values as a local run.

Code that runs while the payload is read (a shipped class's ``__setstate__``
or ``__init__``, called to rebuild an instance) is user code like the traced
block: it runs in the job's process, under the same layers, with the same
guarded builtins, which is what the last cases show.
"""

from __future__ import annotations

import re

import pytest
from parity_programs import shipped_module

from .helpers import PROMPT, run_blob, serialized_request

#: One module per hostile class, each shipped by value through ``nnsight.register``
#: (a module is shipped whole, so one class per module keeps each case to itself).
HOSTILE = {
    "ReachesOs": '''
class ReachesOs:
    """Fine to look at; one method imports a module no request may import."""

    def __init__(self, value):
        self.value = value

    def where(self):
        import os
        return os.getcwd()
''',
    "HoldsSubprocess": '''
class HoldsSubprocess:
    tool = None
''',
    "RunsOnLoad": '''
class RunsOnLoad:
    """Its __setstate__ runs while the payload is read, on the server."""

    def __init__(self):
        self.armed = True

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.secret = open("/etc/passwd").read()
''',
    "ImportsInAMethod": '''
import typing


class ImportsInAMethod(typing.NamedTuple):
    value: int

    def peek(self):
        import subprocess
        return subprocess.run(["id"], capture_output=True).stdout
''',
    "WithFinalizer": '''
import dataclasses


@dataclasses.dataclass
class WithFinalizer:
    value: int = 0
''',
    "Level": '''
import enum


class Level(enum.Enum):
    LOW = 1

    def escape(self):
        return eval("1 + 1")
''',
}


def hostile(name):
    module = shipped_module(f"nnhost_hostile_{name.lower()}", HOSTILE[name])
    if name == "HoldsSubprocess":
        import subprocess

        module.HoldsSubprocess.tool = subprocess
    if name == "WithFinalizer":
        module.WithFinalizer.__del__ = print
    return getattr(module, name)


CASES = []


def case(expect: str):
    def register(program):
        CASES.append(pytest.param(program, expect, id=program.__name__[5:]))
        return program

    return register


@case(r"importing 'os' is not allowed on this server")
def case_method_reaches_a_refused_module(model, url):
    ReachesOs = hostile("ReachesOs")
    with model.trace(PROMPT, remote=url):
        value = ReachesOs(3).value.save()


@case(r"importing 'subprocess' is not allowed on this server")
def case_class_attribute_is_a_refused_module(model, url):
    HoldsSubprocess = hostile("HoldsSubprocess")
    with model.trace(PROMPT, remote=url):
        tool = HoldsSubprocess.tool
        out = model.lm_head.output.save()


@case(r"'open' is not available on this server")
def case_setstate_reads_a_file_while_loading(model, url):
    armed = hostile("RunsOnLoad")()
    with model.trace(PROMPT, remote=url):
        flag = armed.armed
        out = model.lm_head.output.save()


@case(r"importing 'subprocess' is not allowed on this server")
def case_named_tuple_method_reaches_a_refused_module(model, url):
    ImportsInAMethod = hostile("ImportsInAMethod")
    with model.trace(PROMPT, remote=url):
        value = ImportsInAMethod(1).value.save()


@case(r"a class that defines __del__")
def case_dataclass_with_a_finalizer(model, url):
    WithFinalizer = hostile("WithFinalizer")
    with model.trace(PROMPT, remote=url):
        made = WithFinalizer(2).save()


@case(r"'eval' is not available on this server")
def case_enum_method_evaluates_a_string(model, url):
    Level = hostile("Level")
    with model.trace(PROMPT, remote=url):
        level = Level.LOW.save()


@pytest.mark.parametrize("program, expect", CASES)
def test_hostile_shipped_class(program, expect, serving, remote_model):
    from nnsight.intervention.backends.remote import RemoteError

    with pytest.raises(RemoteError) as caught:
        program(remote_model, serving.url)
    assert re.search(expect, str(caught.value), re.S), str(caught.value)


# --- hand-built payloads: what the client would never send ------------------------------------


def _with_extra(blob: bytes, extra: bytes) -> bytes:
    """A normal request whose tuple carries one more object, built by ``extra``'s opcodes.

    The payload is ``(tracer, block)``; it becomes ``(tracer, block, extra)``
    (TUPLE3 for the final TUPLE2), so the extra object is read, its calls
    made, and it is still part of the payload when the load ends.
    """
    blob = _unframed(blob)
    assert blob.endswith(b"\x86\x94."), blob[-8:]
    return blob[:-3] + extra + b"\x87\x94."


def _unframed(blob: bytes) -> bytes:
    """The same pickle without protocol 4's FRAME opcodes (whose lengths an insertion breaks)."""
    import pickletools

    ops = list(pickletools.genops(blob))
    parts = []
    for index, (op, _arg, position) in enumerate(ops):
        end = ops[index + 1][2] if index + 1 < len(ops) else len(blob)
        if op.name != "FRAME":
            parts.append(blob[position:end])
    return b"".join(parts)


def _text(value: str) -> bytes:
    encoded = value.encode()
    return b"\x8c" + bytes([len(encoded)]) + encoded


def _global(module: str, name: str) -> bytes:
    return _text(module) + _text(name) + b"\x93"


def skeleton(metaclass: bytes, bases: bytes = b")") -> bytes:
    # _make_skeleton_class(metaclass, "Evil", bases, {}, None, None)
    return (
        _global("cloudpickle.cloudpickle", "_make_skeleton_class")
        + b"(" + metaclass + _text("Evil") + bases + b"}NNt" + b"R"
    )


HAND_BUILT = [
    pytest.param(
        # A metaclass whose __new__ is library code of a refused kind.
        lambda: skeleton(_global("enum", "EnumMeta")),
        r"classes must be plain classes",
        id="metaclass-not-plain",
    ),
    pytest.param(
        # A base that is neither a class nor typing's generic form.
        lambda: skeleton(_global("builtins", "type"), _global("builtins", "print") + b"\x85"),
        r"bases that are neither classes nor typing's generic forms",
        id="base-not-a-class",
    ),
    pytest.param(
        # Filling in a class the payload did not make (torch's Module).
        lambda: _global("cloudpickle.cloudpickle", "_class_setstate")
        + _global("torch.nn", "Module") + b"}" + b"}" + b"\x86" + b"\x86R",
        r"only classes shipped in the request may be filled in",
        id="setstate-on-a-library-class",
    ),
    pytest.param(
        # A function sent as bytecode that stays in the payload: refused, no code built.
        lambda: _global("cloudpickle.cloudpickle", "_make_function")
        + b"(" + _global("cloudpickle.cloudpickle", "_builtin_type") + _text("CodeType") + b"\x85R"
        + b"(K\x00K\x00" + b"t" + b"R" + b"}" + _text("f") + b"NNt" + b"R",
        r"compiled bytecode.*_make_function",
        id="bytecode-function-kept",
    ),
    pytest.param(
        # A subscript of something that is not a type: would read any container.
        lambda: _global("_operator", "getitem") + _text("Module:model.transformer.h") + b"Q"
        + b"K\x00" + b"\x86R",
        r"only type annotations are subscripted",
        id="getitem-on-the-model",
    ),
    pytest.param(
        # A reduce that is not a union of types.
        lambda: _global("_functools", "reduce") + _global("builtins", "print") + b"(K\x01K\x02t" + b"\x86R",
        r"only a union of types is reduced",
        id="functools-reduce",
    ),
]


@pytest.mark.parametrize("make_extra, refused", HAND_BUILT)
def test_hand_built_class_payload_is_refused(make_extra, refused, serving, remote_model):
    blob = _with_extra(serialized_request(remote_model), make_extra())
    final = run_blob(serving, blob)
    assert final["status"] == "ERROR", final
    assert re.search(refused, final["description"], re.S), final["description"]

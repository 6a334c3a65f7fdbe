"""Sending back an instance of a class the user's code made while the job ran.

A named tuple built in the trace (``collections.namedtuple``,
``typing.NamedTuple``), a ``dataclasses.make_dataclass``, an enum from the
functional API or a class statement inside a helper exist only in the job's
process: pickle names a class by its module and name, and there is no such
name for the client to import. Locally the user gets an instance of that
class, so the result must carry an equivalent one.

The server sends no code of its own making to a client, so such a class goes
back as a call the client makes with its own standard library, on data only:
``collections.namedtuple(name, fields)``, ``dataclasses.make_dataclass(name,
fields)``, the enum's base called with its members, or ``type(name, bases,
attributes)`` with the class's data attributes. The class the client gets has
the same name, module, fields, members and values; its methods (the job's
code) stay behind, apart from those the standard library makes for it.

`remade_class_reduce` is used by the result pickler (`result_writing`) only;
it must never put a function or code object of the job's into a result.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import sys
import types
import typing
from typing import Any, Optional


def by_reference(obj: Any) -> bool:
    """Whether pickle's ``module.qualname`` for ``obj`` names ``obj`` itself.

    Only modules already imported are looked in: a result must not import
    anything to be written. The classes of None, ``...`` and
    ``NotImplemented`` have no such name; pickle writes them its own way.
    """
    if obj is type(None) or obj is type(...) or obj is type(NotImplemented):
        return True
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<locals>" in qualname:
        return False
    found: Any = sys.modules.get(module)
    if found is None:
        return False
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return False
    return found is obj


class _Call:
    """Pickles as ``function(*args, **kwargs)``, made by the client when it loads the result."""

    def __init__(self, function: Any, *args: Any, **kwargs: Any) -> None:
        self.function = functools.partial(function, **kwargs) if kwargs else function
        self.args = args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.function, self.args)


def remade_class_reduce(cls: type) -> Optional[tuple[Any, ...]]:
    """How the client makes a class equivalent to ``cls``; None if it cannot.

    A reduce tuple: a standard-library call on data, then the names that call
    does not set (``__qualname__``, ``__doc__``), set as attributes.
    """
    names: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    if isinstance(cls.__dict__.get("__doc__"), str):
        names["__doc__"] = cls.__dict__["__doc__"]
    if isinstance(cls, enum.EnumMeta):
        call = _enum_call(cls)
    elif "__dataclass_fields__" in cls.__dict__:
        call = _dataclass_call(cls)
    elif issubclass(cls, tuple) and isinstance(cls.__dict__.get("_fields"), tuple):
        call = _named_tuple_call(cls)
        annotations = cls.__dict__.get("__annotations__")
        if isinstance(annotations, dict) and annotations:  # a typing.NamedTuple
            names["__annotations__"] = {key: _annotation(value, cls) for key, value in annotations.items()}
    else:
        call = _plain_call(cls)
    if call is None:
        return None
    if "__setstate__" in cls.__dict__:
        # Its class would take the names for an instance's state (a slotted
        # dataclass): the client's class keeps the name and module it was made with.
        return (call.function, call.args)
    return (call.function, call.args, (None, names))


def _named_tuple_call(cls: type) -> _Call:
    fields = tuple(cls.__dict__["_fields"])
    defaults = getattr(cls, "_field_defaults", {})
    kwargs: dict[str, Any] = {"module": cls.__module__}
    if isinstance(defaults, dict) and defaults:
        kwargs["defaults"] = tuple(defaults[name] for name in fields if name in defaults)
    return _Call(collections.namedtuple, cls.__name__, fields, **kwargs)


_DATACLASS_OPTIONS = ("init", "repr", "eq", "order", "unsafe_hash", "frozen")
#: Options of later Pythons, sent only when set, so that an older client's
#: ``make_dataclass`` is not given a keyword it does not know.
_LATER_OPTIONS = {"match_args": True, "kw_only": False, "slots": False}


def _dataclass_call(cls: type) -> _Call:
    params = cls.__dict__.get("__dataclass_params__")
    options: dict[str, Any] = {name: bool(getattr(params, name, False)) for name in _DATACLASS_OPTIONS}
    for name, usual in _LATER_OPTIONS.items():
        value = getattr(params, name, usual)
        if value != usual:
            options[name] = value
    if "__slots__" in cls.__dict__ and "slots" not in options:
        options["slots"] = True
    fields = []
    for item in dataclasses.fields(cls):
        spec: dict[str, Any] = {}
        if item.default is not dataclasses.MISSING:
            spec["default"] = item.default
        elif item.default_factory is not dataclasses.MISSING and by_reference(item.default_factory):
            spec["default_factory"] = item.default_factory
        for flag, usual in (("init", True), ("repr", True), ("compare", True)):
            if getattr(item, flag) != usual:
                spec[flag] = getattr(item, flag)
        kind = _annotation(item.type, cls)
        fields.append((item.name, kind, _Call(dataclasses.field, **spec)) if spec else (item.name, kind))
    bases = tuple(base for base in cls.__bases__ if base is not object)
    if bases:
        options["bases"] = bases
    return _Call(dataclasses.make_dataclass, cls.__name__, fields, **options)


def _enum_call(cls: Any) -> Optional[_Call]:
    base = next(
        (klass for klass in cls.__mro__[1:] if klass.__module__ == "enum" and isinstance(klass, enum.EnumMeta)),
        None,
    )
    if base is None or not by_reference(base):
        return None
    members = [(name, member._value_) for name, member in cls.__members__.items()]
    kwargs: dict[str, Any] = {"module": cls.__module__, "qualname": cls.__qualname__}
    mixed = getattr(cls, "_member_type_", object)
    if mixed is not object and not issubclass(base, mixed) and by_reference(mixed):
        kwargs["type"] = mixed
    return _Call(base, cls.__name__, members, **kwargs)


#: What a class body holds that is code or is made by the class machinery:
#: never sent, and made again by the client's Python where it is needed.
_NOT_DATA = (
    types.FunctionType, staticmethod, classmethod, property, types.MemberDescriptorType,
    types.GetSetDescriptorType, types.BuiltinFunctionType, types.MethodType,
)


def _plain_call(cls: type) -> _Call:
    namespace: dict[str, Any] = {}
    for name, value in cls.__dict__.items():
        if name in ("__dict__", "__weakref__", "__module__", "__qualname__", "__doc__"):
            continue
        if isinstance(value, _NOT_DATA) or (isinstance(value, type) and value is cls):
            continue
        namespace[name] = _annotations(value, cls) if name == "__annotations__" else value
    namespace["__module__"] = cls.__module__
    # ``type`` hands the class to the bases' own metaclass (an ``ABC``'s), as a class statement does.
    return _Call(type, cls.__name__, cls.__bases__, namespace)


def forward_ref_reduce(reference: typing.ForwardRef) -> tuple[Any, ...]:
    """An annotation's text as the client makes it: ``typing.ForwardRef(text)``, never its code."""
    return (typing.ForwardRef, (reference.__forward_arg__,))


def _annotations(value: Any, cls: type) -> Any:
    if not isinstance(value, dict):
        return value
    return {key: _annotation(item, cls) for key, item in value.items()}


def _annotation(kind: Any, cls: type) -> Any:
    """``kind``, or its text where it names ``cls`` itself (a tree node's ``Optional[Node]``).

    The class is made from its annotations, so one that names the class cannot
    be sent before the class is; its text is what a forward reference holds.
    """
    if _mentions(kind, cls, 0):
        return kind.__qualname__ if kind is cls else repr(kind).replace(f"{cls.__module__}.", "")
    return kind


def _mentions(kind: Any, cls: type, depth: int) -> bool:
    if kind is cls:
        return True
    if depth > 8:
        return False
    return any(_mentions(argument, cls, depth + 1) for argument in typing.get_args(kind))

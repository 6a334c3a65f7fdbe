"""What a request payload may name and call while it is read, and how a refusal reads.

The data `RestrictedUnpickler` (`unpickling`) and its checked reconstructors
(`unpickling.reconstructors`) apply: the builtins a payload may name, the
constructors and rebuilders it may call, the classes it may make. Kept apart
from the opcode logic so that what is allowed can be read, and reviewed, in
one place.

It must never widen anything by itself: each entry here is a door for every
request, so an addition needs the same scrutiny as a change to the unpickler.
Nothing here imports or calls what it lists (`newobj_bases` and `builtin`
only look names up when the unpickler asks).
"""

from __future__ import annotations

import collections
import functools
import pickle
from typing import Any

from ..python_layer.sandbox import SandboxViolation


class RefusedPayload(SandboxViolation, pickle.UnpicklingError):
    """The payload asks for something a request may not do while being read."""


def _builtin_exception_names() -> frozenset[str]:
    import builtins

    return frozenset(
        name
        for name, value in vars(builtins).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    )


SAFE_BUILTINS = frozenset(
    "set frozenset list dict tuple bytes bytearray complex slice range int float str bool "
    "object type abs all any len max min sum sorted round divmod pow zip map filter "
    "enumerate reversed isinstance issubclass iter next repr format hash id chr ord bin hex "
    "oct print callable NotImplemented Ellipsis "
    # A class's methods: these only wrap the function they are given.
    "staticmethod classmethod property".split()
) | _builtin_exception_names()  # a user's exception class derives from one

#: Of `DEFINITION_GLOBALS`, what a payload may call: a named tuple's field accessor,
#: by the name each Python writes (``_collections`` up to 3.11, ``collections``
#: from 3.12: a client on 3.12 was refused by name before this).
DEFINITION_CALLABLES = (("_collections", "_tuplegetter"), ("collections", "_tuplegetter"))

#: Wrappers a class body makes of its methods; a payload may call them to rebuild one.
DESCRIPTOR_TYPES = (staticmethod, classmethod, property)
BUILTIN_CONSTRUCTORS: tuple[type, ...] = (
    set, frozenset, list, dict, tuple, bytes, bytearray, complex, slice, range, int, float,
    str, bool,
)
SAFE_TYPE_NAMES = frozenset(
    "SimpleNamespace MethodType NoneType EllipsisType NotImplementedType GenericAlias UnionType "
    # A dataclass field's metadata; CodeType becomes a refusal stand-in, never code.
    "MappingProxyType CodeType".split()
)


def _missing() -> Any:
    import dataclasses

    class MissingField:
        """``dataclasses._MISSING_TYPE()`` in a payload: the one MISSING, not a copy."""

        def __new__(cls, *args: Any) -> Any:
            return dataclasses.MISSING

    return MissingField


def _has_default_factory() -> Any:
    import dataclasses

    class HasDefaultFactory:
        """The dataclasses sentinel a generated ``__init__`` compares against."""

        def __new__(cls, *args: Any) -> Any:
            return getattr(dataclasses, "_HAS_DEFAULT_FACTORY", None)

    return HasDefaultFactory


def _attribute(module: str, name: str) -> Any:
    def resolve() -> Any:
        import importlib

        return getattr(importlib.import_module(module), name)

    return resolve


def _attribute_or(module: str, name: str, older: str) -> Any:
    """``module.name``, or on a Python before it, ``module.older`` (what it stands for)."""

    def resolve() -> Any:
        import importlib

        found = importlib.import_module(module)
        return getattr(found, name, None) or getattr(found, older)

    return resolve


def _cached(make: Any) -> Any:
    made: list[Any] = []

    def resolve() -> Any:
        if not made:
            made.append(make())
        return made[0]

    return resolve


#: What cloudpickle writes for a class from the user's script, named whatever
#: the import policy: the pieces of a dataclass, an enum, an abstract base and a
#: named tuple's field accessors. Each is named only: a payload may make an
#: instance of the data types among them (NEWOBJ), and call only what
#: `DEFINITION_CALLABLES` lists.
DEFINITION_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        ("dataclasses", name): _attribute("dataclasses", name)
        for name in (
            "Field", "_DataclassParams", "KW_ONLY", "InitVar", "_KW_ONLY_TYPE", "FrozenInstanceError"
        )
    },
    ("dataclasses", "_MISSING_TYPE"): _cached(_missing),
    ("dataclasses", "_HAS_DEFAULT_FACTORY_CLASS"): _cached(_has_default_factory),
    # A dataclass from Python 3.13 has ``__replace__ = dataclasses._replace`` (for
    # ``copy.replace``, which earlier Pythons lack): there, ``dataclasses.replace``
    # does the same. Named only, never called by the payload.
    ("dataclasses", "_replace"): _attribute_or("dataclasses", "_replace", "replace"),
    # From Python 3.13 a dataclass's ``__repr__`` is wrapped by ``reprlib.recursive_repr``,
    # whose wrapper names the thread-id function it keys running calls by. Named only.
    ("_thread", "get_ident"): _attribute("_thread", "get_ident"),
    **{
        ("enum", name): _attribute("enum", name)
        for name in (
            "Enum IntEnum Flag IntFlag StrEnum ReprEnum EnumMeta EnumType auto unique".split()
        )
    },
    **{("abc", name): _attribute("abc", name) for name in ("ABC", "ABCMeta", "abstractmethod")},
    ("_collections", "_tuplegetter"): _attribute("_collections", "_tuplegetter"),
    ("collections", "_tuplegetter"): _attribute("collections", "_tuplegetter"),
    # The metaclass of a TypedDict (a skeleton is made with it).
    ("typing", "_TypedDictMeta"): _attribute("typing", "_TypedDictMeta"),
}
TORCH_REBUILDERS = {
    "torch._utils": (
        "_rebuild_tensor _rebuild_tensor_v2 _rebuild_tensor_v3 _rebuild_parameter "
        "_rebuild_parameter_with_state _rebuild_device_tensor_from_numpy "
        "_rebuild_device_tensor_from_cpu_tensor _rebuild_meta_tensor_no_storage"
    ),
}
NUMPY_REBUILDERS = {
    "numpy._core.multiarray": "_reconstruct scalar",
    "numpy.core.multiarray": "_reconstruct scalar",
}
#: Module loaders and specs travel inside a module shipped by value; a loader
#: can read files, so each becomes an inert placeholder.
IMPORT_MACHINERY = ("_frozen_importlib", "_frozen_importlib_external", "importlib")


class Inert:
    """Stands in for an import spec or loader in a module shipped by value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


def describe(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return f"{module}.{name}"


def refuse(what: str, why: str = "") -> RefusedPayload:
    return RefusedPayload(
        f"Your request's payload refers to {what}, which this server does not accept "
        f"in a request{': ' + why if why else ''}."
    )

def newobj_bases() -> tuple[type, ...]:
    """Classes whose instances a payload may make (and then fill in with BUILD)."""
    import types as _types

    import torch

    bases: list[type] = [
        torch.nn.Module, torch.Tensor, BaseException, _types.SimpleNamespace,
        collections.OrderedDict, collections.defaultdict, collections.deque, functools.partial,
    ]
    try:
        import numpy

        bases.append(numpy.ndarray)
    except ImportError:
        pass
    return tuple(bases)


def builtin(name: str) -> Any:
    import builtins

    return getattr(builtins, name)

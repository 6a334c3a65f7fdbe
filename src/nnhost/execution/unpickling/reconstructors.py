"""Checked replacements for the reconstructors nnsight payloads call.

A payload rebuilds shipped functions, classes and modules through cloudpickle's
and nnsight's helpers, and tensors through torch's. `checked_reconstructors`
gives `RestrictedUnpickler` (`unpickler`) the versions it lets a payload call:
a shipped function's source passes `check_source` and runs with the guarded
builtins; a module shipped by value gets them too; ``subimport`` obeys the
import policy; a tensor storage is read with ``torch.load(weights_only=True)``;
only classes and functions the payload itself shipped may be filled in.

Each replacement is a closure over the unpickler that is reading the payload
(what it protects, what it created), so it must never be shared between loads,
and it must never hand the payload the original, unchecked helper.
"""

from __future__ import annotations

import abc
import functools
import importlib
import io
import types
from typing import TYPE_CHECKING, Any, Callable

from ..python_layer.sandbox import SandboxViolation, attribute_problem, check_source, install_builtins
from ..python_layer.sandbox_rules import DENIED_METHODS
from .allowlist import NUMPY_REBUILDERS, SAFE_TYPE_NAMES, TORCH_REBUILDERS, describe, refuse
from .shipped_classes import (
    Unavailable,
    is_unavailable,
    library_template,
    rebind_methods,
    remember_client_class,
)

if TYPE_CHECKING:
    from .state import Load


def checked_reconstructors(me: Load) -> dict[tuple[str, str], Callable[..., Any]]:
    """``(module, name)`` to what a payload naming that global gets, for ``me``'s load."""
    from cloudpickle import cloudpickle as cp  # type: ignore[import-untyped]
    from nnsight.intervention import serialization  # type: ignore[import-untyped]

    policy, user_builtins = me.policy, me.builtins_dict

    def subimport(name: str) -> Any:
        problem = policy.import_problem(name) if policy.enabled else None
        if problem:
            # Refused only if it is still needed when the load is over (a method
            # the server makes again may have been its only user).
            return me.defer(problem)
        if name.split(".")[0] == "builtins":
            module = types.ModuleType("builtins")
            vars(module).update(
                {k: v for k, v in user_builtins.items() if not k.startswith("__")}
            )
            return me.protect(module)
        return me.protect(importlib.import_module(name))

    def dynamic_subimport(name: str, namespace: dict[str, Any]) -> Any:
        if not isinstance(name, str) or not isinstance(namespace, dict):
            raise refuse("a malformed module")
        module = types.ModuleType(name)
        skip = {"__builtins__", "__loader__", "__spec__", "__file__", "__cached__", "__path__"}
        vars(module).update({k: v for k, v in namespace.items() if k not in skip})
        install_builtins(vars(module), user_builtins)
        return module

    def builtin_type(name: str) -> Any:
        if name not in SAFE_TYPE_NAMES:
            raise refuse(f"types.{name}", "only plain data types are")
        if name == "MethodType":
            return me.allow_call(bind_method)
        if name == "CodeType":
            return me.allow_call(code_stub)
        return me.allow_call(me.protect(getattr(types, name)))

    def bind_method(function: Any, instance: Any) -> Any:
        if not isinstance(function, (types.FunctionType, types.BuiltinFunctionType)):
            raise refuse("a method of something that is not a function")
        return types.MethodType(function, instance)

    def code_stub(*args: Any) -> Unavailable:
        # Never a code object: bytecode is refused; the names are for the message.
        names = [a for a in args if isinstance(a, str)][:2]
        return Unavailable(
            f"Your request's payload refers to compiled bytecode ({' '.join(names) or 'a code object'}), "
            "which this server does not accept in a request"
        )

    def make_function(*args: Any) -> Unavailable:
        if len(args) != 5:
            raise refuse("cloudpickle.cloudpickle._make_function", "a malformed function")
        code, name = args[0], args[2]
        described = code.reason if isinstance(code, Unavailable) else "compiled bytecode"
        return me.defer(
            f"{described}: the function {name!r} came without its source "
            "(cloudpickle.cloudpickle._make_function). Define it in a file nnsight can read, "
            "or in your script, so that its source is sent"
        )

    def function_setstate(obj: Any, state: Any) -> Any:
        if not isinstance(obj, Unavailable):
            raise refuse(describe(obj), "only functions shipped in the request may be filled in")
        return obj

    def check_bases(bases: Any) -> tuple[Any, ...]:
        if not isinstance(bases, tuple) or not all(
            isinstance(b, type) or typing_base(b) for b in bases
        ):
            raise refuse("a class with bases that are neither classes nor typing's generic forms")
        return bases

    def typing_base(base: Any) -> bool:
        # typing.NamedTuple, typing.Generic[T], typing.Protocol[T]: they name
        # their real bases through __mro_entries__.
        return id(base) in me.protected and (
            getattr(base, "__module__", None) == "typing" or type(base).__module__ == "typing"
        )

    def track(cls: type, tracker_id: Any) -> type:
        me.classes[id(cls)] = cls
        remember_client_class(cls, tracker_id)
        return me.allow_call(cls)

    def make_skeleton_class(
        type_constructor: Any, name: Any, bases: Any, type_kwargs: Any, tracker_id: Any, extra: Any
    ) -> type:
        if not (
            type_constructor in (type, abc.ABCMeta)
            or (
                isinstance(type_constructor, type)
                and issubclass(type_constructor, type)
                and type_constructor.__module__ in ("typing", "abc")
            )
        ):
            raise refuse(describe(type_constructor), "classes must be plain classes")
        check_bases(bases)
        if not isinstance(type_kwargs, dict) or not isinstance(name, str):
            raise refuse("a malformed class")
        for key in type_kwargs:
            if not isinstance(key, str) or key == "__del__" or key in DENIED_METHODS:
                raise refuse(f"a class that defines {key!r}", "it would run outside your request")
        # No tracker id here: a class must never resolve to one another request
        # made. The client's id is kept only to send results back to its class.
        cls = cp._make_skeleton_class(type_constructor, name, bases, type_kwargs, None, None)
        return track(cls, tracker_id)

    def make_skeleton_enum(
        bases: Any, name: Any, qualname: Any, members: Any, module: Any, tracker_id: Any, extra: Any
    ) -> type:
        import enum

        check_bases(bases)
        if not (bases and isinstance(bases[-1], type) and issubclass(bases[-1], enum.Enum)):
            raise refuse("an enum whose last base is not an Enum")
        if not (isinstance(name, str) and isinstance(qualname, str) and isinstance(module, str)):
            raise refuse("a malformed enum")
        if not isinstance(members, dict) or not all(
            isinstance(key, str) and key.isidentifier() for key in members
        ):
            raise refuse("a malformed enum")
        cls = cp._make_skeleton_enum(bases, name, qualname, members, module, None, None)
        return track(cls, tracker_id)

    def make_typevar(
        name: Any, bound: Any, constraints: Any, covariant: Any, contravariant: Any, tracker_id: Any
    ) -> Any:
        import typing

        if not isinstance(name, str) or not isinstance(constraints, tuple):
            raise refuse("a malformed type variable")
        return typing.TypeVar(
            name, *constraints, bound=bound, covariant=bool(covariant), contravariant=bool(contravariant)
        )

    def class_setstate(obj: Any, state: Any) -> Any:
        if id(obj) not in me.classes:
            raise refuse(describe(obj), "only classes shipped in the request may be filled in")
        if not (isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict)):
            raise refuse("a malformed class")
        attributes, slots = state
        for name, value in attributes.items():
            if not isinstance(name, str):
                raise refuse("a malformed class")
            if name == "__del__" or (
                name in DENIED_METHODS and (id(value) in me.functions or is_unavailable(value))
            ):
                raise refuse(f"a class that defines {name}", "it would run outside your request")
        attributes = dict(attributes)
        library = library_template(obj, attributes)
        complete = None
        if library is not None:
            # What the library generated arrives without source: made again below.
            generated, complete = library
            attributes = {
                k: v for k, v in attributes.items() if not (k in generated and is_unavailable(v))
            }
        rebind_methods(obj, attributes, me.sources)
        for value in attributes.values():
            for part in (value.__func__,) if isinstance(value, (staticmethod, classmethod)) else (value,):
                if isinstance(part, types.FunctionType):
                    me.functions[id(part)] = part
        cp._class_setstate(obj, (attributes, slots))
        if complete is not None:
            complete(obj)
        return obj

    def load_function(
        source: Any, name: Any, defaults: Any, kwdefaults: Any, annotations: Any, filename: Any, line: Any
    ) -> Any:
        if not (isinstance(source, str) and isinstance(name, str) and isinstance(filename, str)):
            raise refuse("a malformed function")
        if not isinstance(line, int) or not 0 < line < 10_000_000:
            raise refuse("a malformed function")
        try:
            check_source(source, f"[{name}:{line}] {filename}", policy, me.syntax_note)
        except SandboxViolation as error:
            # Refused only if still needed once the load is over: a method of a
            # named tuple or dataclass the server makes again may replace it.
            return me.defer(str(error))
        loaded = serialization._load_function(
            source, name, defaults, kwdefaults, annotations, filename, line
        )
        # Rebuilt around a fresh globals dict that holds the guarded builtins:
        # a function takes its builtins from its globals when it is *made*,
        # so setting them afterwards would not reach its calls.
        namespace: dict[str, Any] = {}
        install_builtins(namespace, user_builtins)
        function = types.FunctionType(
            loaded.__code__, namespace, loaded.__name__, loaded.__defaults__, loaded.__closure__
        )
        function.__kwdefaults__ = loaded.__kwdefaults__
        function.__annotations__ = loaded.__annotations__
        function.__qualname__ = loaded.__qualname__
        me.functions[id(function)] = function
        me.sources[id(function)] = (source, name, f"[{name}:{line}] {filename}", line)
        return function

    def fill(function: Any, namespace: Any) -> None:
        if isinstance(function, Unavailable) and isinstance(namespace, dict):
            return
        if id(function) not in me.functions or not isinstance(namespace, dict):
            raise refuse("globals for a function the request did not ship")
        namespace = {k: v for k, v in namespace.items() if k != "__builtins__"}
        function.__globals__.update(namespace)

    def guarded_getattr(obj: Any, name: Any) -> Any:
        problem = attribute_problem(name)
        if name == "__new__" and isinstance(obj, type):
            problem = None  # a class's constructor (``tuple.__new__`` in a named tuple's _make)
        if problem:
            raise refuse(f"the attribute {name!r}", problem)
        return me.protect(getattr(obj, name))

    def numpy_dtype(spec: Any, align: bool = False, copy: bool = False) -> Any:
        import numpy

        # Always a copy: the shared dtype singletons must never be what a
        # following BUILD writes into.
        return numpy.dtype(spec, bool(align), True)

    def subscript(obj: Any, key: Any) -> Any:
        # ``Optional[int]``, ``List[str]``, ``dict[str, int]`` in annotations: only
        # typing's forms and classes are subscripted, never a container.
        if not (isinstance(obj, type) or type(obj).__module__ == "typing"):
            raise refuse(f"a subscript of {describe(obj)}", "only type annotations are subscripted")
        return me.protect(obj[key])

    def annotation(value: Any) -> bool:
        return value is None or isinstance(value, type) or type(value).__module__ in ("typing", "types")

    def type_union(left: Any, right: Any) -> Any:
        # ``int | None`` in an annotation (types.UnionType pickles as a reduce of ``|``).
        if not (annotation(left) and annotation(right)):
            raise refuse("a ``|`` of values that are not types", "only type annotations are combined")
        return me.protect(left | right)

    def reduce_union(function: Any, items: Any) -> Any:
        if function is not type_union or not isinstance(items, tuple) or not items:
            raise refuse("a call to functools.reduce", "only a union of types is reduced")
        return functools.reduce(type_union, items)

    def field_type_sentinel(name: Any) -> Any:
        try:
            return me.protect(cp._get_dataclass_field_type_sentinel(name))
        except (KeyError, TypeError):
            raise refuse("a malformed dataclass field") from None

    def load_from_bytes(data: Any) -> Any:
        import torch

        if not isinstance(data, (bytes, bytearray)):
            raise refuse("a malformed tensor storage")
        return torch.load(io.BytesIO(data), weights_only=True)

    def rebuild_from_type_v2(function: Any, new_type: Any, args: Any, state: Any) -> Any:
        import torch
        from torch._tensor import _rebuild_from_type_v2

        if id(function) not in me.callables or not (
            isinstance(new_type, type) and issubclass(new_type, torch.Tensor)
        ):
            raise refuse("a tensor rebuilt by something other than torch's rebuilders")
        return _rebuild_from_type_v2(function, new_type, args, state)  # type: ignore[no-untyped-call]

    cloud = "cloudpickle.cloudpickle"
    substitutes: dict[tuple[str, str], Callable[..., Any]] = {
        (cloud, "subimport"): subimport,
        (cloud, "dynamic_subimport"): dynamic_subimport,
        (cloud, "_builtin_type"): builtin_type,
        (cloud, "_make_skeleton_class"): make_skeleton_class,
        (cloud, "_class_setstate"): class_setstate,
        (cloud, "_make_skeleton_enum"): make_skeleton_enum,
        (cloud, "_make_typevar"): make_typevar,
        (cloud, "_make_function"): make_function,
        (cloud, "_function_setstate"): function_setstate,
        (cloud, "_make_cell"): cp._make_cell,
        (cloud, "_make_empty_cell"): cp._make_empty_cell,
        (cloud, "_get_dataclass_field_type_sentinel"): field_type_sentinel,
        ("_operator", "getitem"): subscript,
        ("operator", "getitem"): subscript,
        ("_operator", "or_"): type_union,
        ("operator", "or_"): type_union,
        ("_functools", "reduce"): reduce_union,
        ("functools", "reduce"): reduce_union,
        (cloud, "_make_dict_keys"): cp._make_dict_keys,
        (cloud, "_make_dict_values"): cp._make_dict_values,
        (cloud, "_make_dict_items"): cp._make_dict_items,
        ("nnsight.intervention.serialization", "_load_function"): load_function,
        ("nnsight.intervention.serialization", "_fill"): fill,
        ("builtins", "getattr"): guarded_getattr,
        ("torch.storage", "_load_from_bytes"): load_from_bytes,
        ("torch._tensor", "_rebuild_from_type_v2"): rebuild_from_type_v2,
        ("numpy", "dtype"): numpy_dtype,
    }
    for module_name, names in {**TORCH_REBUILDERS, **NUMPY_REBUILDERS}.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in names.split():
            if hasattr(module, name):
                substitutes[(module_name, name)] = getattr(module, name)
    return substitutes

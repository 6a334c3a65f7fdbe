"""Checked replacements for the reconstructors nnsight payloads call.

A payload rebuilds shipped functions, classes and modules through cloudpickle's
and nnsight's helpers, and tensors through torch's. `checked_reconstructors`
gives `RestrictedUnpickler` (`unpickling`) the versions it lets a payload call:
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
import importlib
import io
import types
from typing import TYPE_CHECKING, Any, Callable

from .sandbox import attribute_problem, check_source, install_builtins
from .unpickling_allowlist import _NUMPY_REBUILDERS, _SAFE_TYPE_NAMES, _TORCH_REBUILDERS, _describe, _refuse

if TYPE_CHECKING:
    from .unpickling import RestrictedUnpickler


def checked_reconstructors(me: RestrictedUnpickler) -> dict[tuple[str, str], Callable]:
    """``(module, name)`` to what a payload naming that global gets, for ``me``'s load."""
    from cloudpickle import cloudpickle as cp
    from nnsight.intervention import serialization

    policy, user_builtins = me.policy, me.builtins_dict

    def subimport(name: str) -> Any:
        policy.check_import(name)
        if name.split(".")[0] == "builtins":
            module = types.ModuleType("builtins")
            vars(module).update(
                {k: v for k, v in user_builtins.items() if not k.startswith("__")}
            )
            return me._protect(module)
        return me._protect(importlib.import_module(name))

    def dynamic_subimport(name: str, namespace: dict) -> Any:
        if not isinstance(name, str) or not isinstance(namespace, dict):
            raise _refuse("a malformed module")
        module = types.ModuleType(name)
        skip = {"__builtins__", "__loader__", "__spec__", "__file__", "__cached__", "__path__"}
        vars(module).update({k: v for k, v in namespace.items() if k not in skip})
        install_builtins(vars(module), user_builtins)
        return module

    def builtin_type(name: str) -> Any:
        if name not in _SAFE_TYPE_NAMES:
            raise _refuse(f"types.{name}", "only plain data types are")
        if name == "MethodType":
            return me._allow_call(bind_method)
        return me._allow_call(me._protect(getattr(types, name)))

    def bind_method(function: Any, instance: Any) -> Any:
        if not isinstance(function, (types.FunctionType, types.BuiltinFunctionType)):
            raise _refuse("a method of something that is not a function")
        return types.MethodType(function, instance)

    def make_skeleton_class(type_constructor, name, bases, type_kwargs, tracker_id, extra):
        if type_constructor not in (type, abc.ABCMeta):
            raise _refuse(_describe(type_constructor), "classes must be plain classes")
        if not isinstance(bases, tuple) or not all(isinstance(b, type) for b in bases):
            raise _refuse("a class with bases that are not classes")
        if not isinstance(type_kwargs, dict):
            raise _refuse("a malformed class")
        # No tracker id: a class must never resolve to one another request made.
        cls = cp._make_skeleton_class(type_constructor, name, bases, type_kwargs, None, None)
        me._classes[id(cls)] = cls
        return me._allow_call(cls)

    def class_setstate(obj: Any, state: Any) -> Any:
        if id(obj) not in me._classes:
            raise _refuse(_describe(obj), "only classes shipped in the request may be filled in")
        return cp._class_setstate(obj, state)

    def load_function(source, name, defaults, kwdefaults, annotations, filename, line):
        if not (isinstance(source, str) and isinstance(name, str) and isinstance(filename, str)):
            raise _refuse("a malformed function")
        if not isinstance(line, int) or not 0 < line < 10_000_000:
            raise _refuse("a malformed function")
        check_source(source, f"[{name}:{line}] {filename}", policy)
        loaded = serialization._load_function(
            source, name, defaults, kwdefaults, annotations, filename, line
        )
        # Rebuilt around a fresh globals dict that holds the guarded builtins:
        # a function takes its builtins from its globals when it is *made*,
        # so setting them afterwards would not reach its calls.
        namespace: dict = {}
        install_builtins(namespace, user_builtins)
        function = types.FunctionType(
            loaded.__code__, namespace, loaded.__name__, loaded.__defaults__, loaded.__closure__
        )
        function.__kwdefaults__ = loaded.__kwdefaults__
        function.__annotations__ = loaded.__annotations__
        function.__qualname__ = loaded.__qualname__
        me._functions[id(function)] = function
        return function

    def fill(function: Any, namespace: Any) -> None:
        if id(function) not in me._functions or not isinstance(namespace, dict):
            raise _refuse("globals for a function the request did not ship")
        namespace = {k: v for k, v in namespace.items() if k != "__builtins__"}
        function.__globals__.update(namespace)

    def guarded_getattr(obj: Any, name: Any) -> Any:
        problem = attribute_problem(name)
        if problem:
            raise _refuse(f"the attribute {name!r}", problem)
        return me._protect(getattr(obj, name))

    def numpy_dtype(spec: Any, align: bool = False, copy: bool = False) -> Any:
        import numpy

        # Always a copy: the shared dtype singletons must never be what a
        # following BUILD writes into.
        return numpy.dtype(spec, bool(align), True)

    def load_from_bytes(data: Any) -> Any:
        import torch

        if not isinstance(data, (bytes, bytearray)):
            raise _refuse("a malformed tensor storage")
        return torch.load(io.BytesIO(data), weights_only=True)

    def rebuild_from_type_v2(function, new_type, args, state):
        import torch
        from torch._tensor import _rebuild_from_type_v2

        if id(function) not in me._callables or not (
            isinstance(new_type, type) and issubclass(new_type, torch.Tensor)
        ):
            raise _refuse("a tensor rebuilt by something other than torch's rebuilders")
        return _rebuild_from_type_v2(function, new_type, args, state)

    cloud = "cloudpickle.cloudpickle"
    substitutes: dict[tuple[str, str], Callable] = {
        (cloud, "subimport"): subimport,
        (cloud, "dynamic_subimport"): dynamic_subimport,
        (cloud, "_builtin_type"): builtin_type,
        (cloud, "_make_skeleton_class"): make_skeleton_class,
        (cloud, "_class_setstate"): class_setstate,
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
    for module_name, names in {**_TORCH_REBUILDERS, **_NUMPY_REBUILDERS}.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in names.split():
            if hasattr(module, name):
                substitutes[(module_name, name)] = getattr(module, name)
    return substitutes

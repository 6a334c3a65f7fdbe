"""Reading a request payload without letting it run anything on the way in.

A payload is a pickle, and a pickle is a program: its opcodes may name any
global (``GLOBAL``), call it (``REDUCE``, ``NEWOBJ``) and write into any object
(``BUILD``, ``SETITEMS``, ``APPENDS``). `RestrictedUnpickler` runs that program
on a leash, with what a legitimate nnsight request needs and nothing more:

* **Naming** a global is allowed from the packages user code may import (the
  `SandboxPolicy`), ``nnsight`` and a handful of data types; each dotted part is
  held to the sandbox's attribute rules, so ``torch.os`` or ``Envoy.__init__.
  __globals__`` cannot be spelled either. Anything else ends the load with an
  error naming the refused global.
* **Calling** is allowed only for reconstructors: the builtin data types, tensor
  and array rebuilders, nnsight's source-based function loader and cloudpickle's
  class and module helpers, several replaced here by checked versions (a shipped
  function's source passes `check_source` and runs with guarded builtins; a
  module shipped by value gets them too; ``subimport`` obeys the import policy;
  a tensor storage is read with ``torch.load(weights_only=True)`` instead of the
  full unpickler torch would use). ``os.system``, ``eval`` through ``REDUCE``,
  ``copyreg._reconstructor``, bytecode functions: refused.
* **Writing** (``BUILD`` and the container opcodes) is allowed only into objects
  the payload itself created: never into a persistent object (the live model's
  modules, its tokenizer), a global, or anything reached through ``getattr``.

The pure-Python unpickler is used because its opcodes can be overridden one by
one; payloads are small (the model travels by reference), so its speed is not
felt.
"""

from __future__ import annotations

import abc
import collections
import enum
import functools
import importlib
import io
import pickle
import types
from typing import Any, Callable, Optional

from .sandbox import (
    SandboxPolicy,
    SandboxViolation,
    attribute_problem,
    check_source,
    guarded_builtins,
    install_builtins,
    untrusted,
)


class RefusedPayload(SandboxViolation, pickle.UnpicklingError):
    """The payload asks for something a request may not do while being read."""


_SAFE_BUILTINS = frozenset(
    "set frozenset list dict tuple bytes bytearray complex slice range int float str bool "
    "object type abs all any len max min sum sorted round divmod pow zip map filter "
    "enumerate reversed isinstance issubclass iter next repr format hash id chr ord bin hex "
    "oct print callable NotImplemented Ellipsis".split()
)
_BUILTIN_CONSTRUCTORS = (
    set, frozenset, list, dict, tuple, bytes, bytearray, complex, slice, range, int, float,
    str, bool,
)
_SAFE_TYPE_NAMES = frozenset(
    "SimpleNamespace MethodType NoneType EllipsisType NotImplementedType GenericAlias UnionType"
    .split()
)
_TORCH_REBUILDERS = {
    "torch._utils": (
        "_rebuild_tensor _rebuild_tensor_v2 _rebuild_tensor_v3 _rebuild_parameter "
        "_rebuild_parameter_with_state _rebuild_device_tensor_from_numpy "
        "_rebuild_device_tensor_from_cpu_tensor _rebuild_meta_tensor_no_storage"
    ),
}
_NUMPY_REBUILDERS = {
    "numpy._core.multiarray": "_reconstruct scalar",
    "numpy.core.multiarray": "_reconstruct scalar",
}
#: Module loaders and specs travel inside a module shipped by value; a loader
#: can read files, so each becomes an inert placeholder.
_IMPORT_MACHINERY = ("_frozen_importlib", "_frozen_importlib_external", "importlib")


class _Inert:
    """Stands in for an import spec or loader in a module shipped by value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


def _describe(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return f"{module}.{name}"


def _refuse(what: str, why: str = "") -> RefusedPayload:
    return RefusedPayload(
        f"Your request's payload refers to {what}, which this server does not accept "
        f"in a request{': ' + why if why else ''}."
    )


class RestrictedUnpickler(pickle._Unpickler):
    """``unpickler=`` for `RequestModel.deserialize`: see the module docstring.

    Build one bound to a policy with `restricted_unpickler`.
    """

    policy: SandboxPolicy = SandboxPolicy()
    builtins_dict: dict = {}

    def __init__(self, file: Any, persistent_objects: Optional[dict] = None) -> None:
        super().__init__(file)
        self.persistent_objects = persistent_objects or {}
        # Objects the payload may read but never write into; kept alive so that
        # an id is not reused during the load.
        self._protected: dict[int, Any] = {}
        self._functions: dict[int, Any] = {}
        self._classes: dict[int, Any] = {}
        self._callables: dict[int, Any] = {}
        self._substitutes: dict[tuple[str, str], Any] = {}
        self._install_substitutes()

    # -- what may be named -------------------------------------------------------

    def _protect(self, obj: Any) -> Any:
        self._protected[id(obj)] = obj
        return obj

    def _allow_call(self, obj: Any) -> Any:
        self._callables[id(obj)] = obj
        return obj

    def find_class(self, module: str, name: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise _refuse("a malformed global")
        key = (module, name)
        if key in self._substitutes:
            return self._substitutes[key]
        qualified = f"{module}.{name}"
        root = module.split(".")[0]
        if root in _IMPORT_MACHINERY:
            return self._allow_call(_Inert)
        if module == "builtins":
            if name not in _SAFE_BUILTINS:
                raise _refuse(qualified, "only data types and pure functions of builtins are")
            return self._protect(_builtin(name))
        if module in ("copyreg", "copy_reg"):
            raise _refuse(qualified, "copyreg reconstructors are not needed by nnsight")
        if root == "collections" or (module, name) == ("functools", "partial"):
            return self._protect(self._resolve(module, name, private_ok=False))
        if root not in self.policy.roots:
            raise _refuse(
                qualified,
                f"globals must come from nnsight or the modules you may import "
                f"({self.policy.describe()})",
            )
        value = self._resolve(module, name, private_ok=root == "nnsight")
        return self._protect(value)

    def _resolve(self, module: str, name: str, private_ok: bool) -> Any:
        qualified = f"{module}.{name}"
        parts = module.split(".")[1:] + name.split(".")
        for part in parts:
            problem = attribute_problem(part)
            if problem or (part.startswith("_") and not private_ok):
                raise _refuse(qualified, problem or "private names are not accepted")
        try:
            value = importlib.import_module(module)
        except Exception as error:
            raise _refuse(qualified, f"the module cannot be imported here ({error})") from None
        for part in name.split("."):
            try:
                value = getattr(value, part)
            except AttributeError:
                raise _refuse(qualified, "no such name on this server") from None
        return value

    def persistent_load(self, pid: Any) -> Any:
        try:
            return self._protect(self.persistent_objects[pid])
        except (KeyError, TypeError):
            raise RefusedPayload(
                f"Your request refers to {pid!r}, which this server's model does not have. "
                "Check that you traced the same model the server serves."
            ) from None

    # -- checked replacements for the reconstructors nnsight payloads use ----------

    def _install_substitutes(self) -> None:
        from cloudpickle import cloudpickle as cp
        from nnsight.intervention import serialization

        policy, user_builtins = self.policy, self.builtins_dict
        me = self

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
        for function in substitutes.values():
            self._allow_call(function)
        self._substitutes = substitutes
        for constructor in _BUILTIN_CONSTRUCTORS + (
            collections.OrderedDict, collections.defaultdict, collections.deque,
            collections.Counter, functools.partial,
        ):
            self._allow_call(constructor)
        try:
            import numpy
            import torch

            for constructor in (torch.Size, torch.device, numpy.ndarray):
                self._allow_call(constructor)
        except ImportError:
            pass

    # -- the opcodes that call or write ------------------------------------------------

    dispatch = dict(pickle._Unpickler.dispatch)

    def _callable_ok(self, function: Any) -> bool:
        if id(function) in self._callables:
            return True
        if isinstance(function, type):
            # Exceptions and enums only look values up or store arguments.
            return issubclass(function, BaseException) or isinstance(function, enum.EnumMeta)
        return False

    def load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        function = stack[-1]
        if not self._callable_ok(function):
            raise _refuse(f"a call to {_describe(function)}", "only reconstructors may be called")
        if not isinstance(args, tuple):
            raise _refuse("a call with malformed arguments")
        value = function(*args)
        if isinstance(function, enum.EnumMeta):
            self._protect(value)  # a member is a shared singleton
        stack[-1] = value

    dispatch[pickle.REDUCE[0]] = load_reduce

    def _check_new(self, cls: Any) -> None:
        """``cls.__new__`` runs library code with the payload's arguments: allow few classes."""
        if not isinstance(cls, type) or issubclass(cls, type):
            raise _refuse(f"an instance of {_describe(cls)}", "only plain classes may be made")
        if id(cls) in self._classes or cls is _Inert or cls in _BUILTIN_CONSTRUCTORS:
            return
        if (cls.__module__ or "").split(".")[0] == "nnsight":
            return
        if issubclass(cls, _newobj_bases()):
            return
        raise _refuse(
            f"an instance of {_describe(cls)}",
            "a request may carry nnsight's objects, tensors, arrays, modules and plain data",
        )

    def load_newobj(self) -> None:
        self._check_new(self.stack[-2])
        pickle._Unpickler.load_newobj(self)

    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self) -> None:
        self._check_new(self.stack[-3])
        pickle._Unpickler.load_newobj_ex(self)

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def _check_target(self, target: Any) -> None:
        if id(target) in self._protected:
            raise _refuse(
                f"a change to {_describe(target)}",
                "a request may not modify the server's objects while it is read",
            )
        if isinstance(target, (type, types.ModuleType, types.FunctionType)) and not (
            id(target) in self._classes or id(target) in self._functions
        ):
            raise _refuse(f"a change to {_describe(target)}", "only objects it creates may be filled in")

    def load_build(self) -> None:
        target = self.stack[-2]
        self._check_target(target)
        self._check_edit(target, self.stack[-1])
        pickle._Unpickler.load_build(self)

    def _check_edit(self, target: Any, state: Any) -> None:
        """An nnsight edit (``envoy.edit``) compiles its source when it is unpickled.

        Its source is held to the same rules as the traced block's, and it gets
        the same guarded builtins, before nnsight compiles it.
        """
        from nnsight.intervention.interleaver import Mediator

        if not isinstance(target, Mediator):
            return
        reduced = state.get("reduced") if isinstance(state, dict) else None
        if not (isinstance(reduced, tuple) and len(reduced) == 3):
            raise _refuse("a malformed edit")
        source, namespace, variables = reduced
        if not (isinstance(source, str) and isinstance(namespace, dict) and isinstance(variables, dict)):
            raise _refuse("a malformed edit")
        check_source(source, "<edit>", self.policy)
        if self.policy.enabled:
            namespace.pop("__builtins__", None)
            install_builtins(namespace, self.builtins_dict)
            install_builtins(variables, self.builtins_dict)

    dispatch[pickle.BUILD[0]] = load_build

    def load_setitem(self) -> None:
        self._check_target(self.stack[-3])
        pickle._Unpickler.load_setitem(self)

    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_append(self) -> None:
        self._check_target(self.stack[-2])
        pickle._Unpickler.load_append(self)

    dispatch[pickle.APPEND[0]] = load_append

    def _check_marked_target(self) -> None:
        # SETITEMS / APPENDS / ADDITEMS write into the object below the last mark.
        if self.metastack:
            below = self.metastack[-1]
            if below:
                self._check_target(below[-1])

    def load_setitems(self) -> None:
        self._check_marked_target()
        pickle._Unpickler.load_setitems(self)

    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_appends(self) -> None:
        self._check_marked_target()
        pickle._Unpickler.load_appends(self)

    dispatch[pickle.APPENDS[0]] = load_appends

    def load_additems(self) -> None:
        self._check_marked_target()
        pickle._Unpickler.load_additems(self)

    dispatch[pickle.ADDITEMS[0]] = load_additems

    def _refuse_opcode(self) -> None:
        raise _refuse("an old pickle opcode (INST, OBJ or an extension code)", "nnsight uses protocol 4")

    for _opcode in (pickle.INST, pickle.OBJ, pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_opcode[0]] = _refuse_opcode
    del _opcode

    # -- the whole payload ---------------------------------------------------------------

    def load(self) -> Any:
        # Library code that evaluates strings (sympy, typing) treats what runs
        # during the load as user code: a payload's objects are the user's.
        with untrusted():
            result = super().load()
        return self._check_payload(result)

    def _check_payload(self, result: Any) -> Any:
        """The payload's shape, the block's source, and the builtins it will run with."""
        from nnsight.tracing.tracer import Tracer
        from nnsight.tracing.util import SerializedFrame

        shape_error = _refuse("something that is not an nnsight trace")
        if not (isinstance(result, tuple) and len(result) == 2):
            raise shape_error
        tracer, block = result
        if not isinstance(tracer, Tracer) or not (isinstance(block, tuple) and len(block) == 3):
            raise shape_error
        source, namespace, variables = block
        if not (isinstance(source, str) and isinstance(namespace, dict) and isinstance(variables, dict)):
            raise shape_error
        info = getattr(tracer, "info", None)
        frame = getattr(info, "frame", None)
        code = getattr(frame, "f_code", None)
        if not isinstance(frame, SerializedFrame) or not isinstance(
            getattr(code, "co_filename", None), str
        ) or not isinstance(getattr(code, "co_name", None), str):
            raise shape_error
        check_source(source, code.co_filename, self.policy)
        if self.policy.enabled:
            namespace.pop("__builtins__", None)
            # The block runs with these as its globals *and* (through nnsight's
            # Scope) its locals; exec reads __builtins__ from the latter.
            install_builtins(namespace, self.builtins_dict)
            install_builtins(variables, self.builtins_dict)
        return result


def _newobj_bases() -> tuple:
    """Classes whose instances a payload may make (and then fill in with BUILD)."""
    import types as _types

    import torch

    bases: list = [
        torch.nn.Module, torch.Tensor, BaseException, _types.SimpleNamespace,
        collections.OrderedDict, collections.defaultdict, collections.deque, functools.partial,
    ]
    try:
        import numpy

        bases.append(numpy.ndarray)
    except ImportError:
        pass
    return tuple(bases)


def _builtin(name: str) -> Any:
    import builtins

    return getattr(builtins, name)


def restricted_unpickler(policy: SandboxPolicy) -> type:
    """A `RestrictedUnpickler` class bound to ``policy`` (what `deserialize` instantiates)."""
    return type(
        "RestrictedUnpickler",
        (RestrictedUnpickler,),
        {"policy": policy, "builtins_dict": guarded_builtins(policy)},
    )

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
felt. What may be named and called is listed in `unpickling.allowlist`; the
checked reconstructors are in `unpickling.reconstructors`. This module applies
them opcode by opcode, and must never let an opcode through unchecked.
"""

from __future__ import annotations

import collections
import enum
import functools
import gc
import importlib
import pickle
import types
import typing
import weakref
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Optional, TypeVar, cast

from ..nnsight_api import Current, current
from ..python_layer.library_hardening import untrusted
from ..python_layer.sandbox import (
    SandboxPolicy,
    attribute_problem,
    check_source,
    guarded_builtins,
    install_builtins,
)
from .allowlist import (
    BUILTIN_CONSTRUCTORS,
    DEFINITION_CALLABLES,
    DEFINITION_GLOBALS,
    DESCRIPTOR_TYPES,
    IMPORT_MACHINERY,
    SAFE_BUILTINS,
    Inert,
    RefusedPayload,
    builtin,
    describe,
    newobj_bases,
    refuse,
)
from .images import build_image, image_class_for, is_image, is_image_class
from .legacy import check_request, is_config_class, legacy_reconstructors, library_class
from .python_versions import cannot_express, same_release, server_python, syntax_note, translate_state
from .reconstructors import checked_reconstructors
from .shipped_classes import Unavailable

__all__ = ["RefusedPayload", "RestrictedUnpickler", "restricted_unpickler"]

_T = TypeVar("_T")

if TYPE_CHECKING:

    class _PythonUnpickler:
        """What this module uses of ``pickle._Unpickler``: typeshed leaves out its opcodes and stacks."""

        dispatch: ClassVar[dict[int, Callable[[Any], None]]]
        stack: list[Any]
        metastack: list[list[Any]]
        memo: dict[int, Any]
        read: Callable[[int], bytes]
        readline: Callable[[], bytes]
        readinto: Callable[[Any], int]
        append: Callable[[Any], None]
        proto: int
        _file_read: Callable[[int], bytes]
        _file_readline: Callable[[], bytes]

        def __init__(self, file: Any) -> None: ...
        def load(self) -> Any: ...
        def load_newobj(self) -> None: ...
        def load_newobj_ex(self) -> None: ...
        def load_build(self) -> None: ...
        def load_setitem(self) -> None: ...
        def load_append(self) -> None: ...
        def load_setitems(self) -> None: ...
        def load_appends(self) -> None: ...
        def load_additems(self) -> None: ...

else:
    _PythonUnpickler = pickle._Unpickler


class _Loaded(Exception):
    """STOP: the payload's object is built; it leaves the opcode loop with this."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class RestrictedUnpickler(_PythonUnpickler):
    """``unpickler=`` for `RequestModel.deserialize`: see the module docstring.

    Build one bound to a policy with `restricted_unpickler`.
    """

    policy: SandboxPolicy = SandboxPolicy()
    builtins_dict: dict[str, Any] = {}
    #: The Python that pickled the payload (``3.12.1``), when the client said (`for_client`).
    client_python: str = ""
    #: What ends a refusal of shipped source this Python cannot parse (`syntax_note`).
    syntax_note: str = ""
    #: The payload is nnsight 0.6's or 0.7's (`unpickling.legacy`), as the process's nnsight is.
    legacy: bool = False

    @classmethod
    def for_client(cls, client_python: str) -> type[RestrictedUnpickler]:
        """This unpickler for one payload, knowing which Python wrote it."""
        return cast("type[RestrictedUnpickler]", type(cls.__name__, (cls,), {
            "client_python": client_python, "syntax_note": syntax_note(client_python),
        }))

    def __init__(self, file: Any, persistent_objects: Optional[dict[Any, Any]] = None) -> None:
        super().__init__(file)
        self.persistent_objects = persistent_objects or {}
        # Registries by id, read by the checked reconstructors too; each keeps its
        # objects alive so that an id is not reused during the load.
        #: Objects the payload may read but never write into.
        self.protected: dict[int, Any] = {}
        #: Functions this load compiled from shipped source (they may be filled in).
        self.functions: dict[int, Any] = {}
        #: Classes the payload shipped (they may be filled in and instantiated).
        self.classes: dict[int, Any] = {}
        #: What the payload may call.
        self.callables: dict[int, Any] = {}
        #: Classes of `DEFINITION_GLOBALS` this payload named (dataclass fields and the like).
        self._definition_types: dict[int, type] = {}
        #: Source of each function this load compiled, to compile a method again in its class.
        self.sources: dict[int, tuple[str, str, str, int]] = {}
        #: Parts of the payload not built (`Unavailable`): refused if still needed at the end.
        self._deferred: list[weakref.ref[Unavailable]] = []
        self._substitutes: dict[tuple[str, str], Any] = {}
        self._install_substitutes()

    # -- what may be named -------------------------------------------------------

    def protect(self, obj: _T) -> _T:
        """``obj`` is the server's: the payload may read it, never write into it."""
        self.protected[id(obj)] = obj
        return obj

    def allow_call(self, obj: _T) -> _T:
        """The payload may call ``obj``."""
        self.callables[id(obj)] = obj
        return obj

    def defer(self, reason: str) -> Unavailable:
        """A stand-in for a part refused only if it is still needed once the load is over."""
        placeholder = Unavailable(reason)
        self._deferred.append(weakref.ref(placeholder))
        return placeholder

    def find_class(self, module: str, name: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise refuse("a malformed global")
        key = (module, name)
        if key in self._substitutes:
            return self._substitutes[key]
        qualified = f"{module}.{name}"
        root = module.split(".")[0]
        if key in DEFINITION_GLOBALS:
            # What cloudpickle writes for a class definition (dataclass fields,
            # enum bases, named tuple accessors), whatever the import policy.
            value = DEFINITION_GLOBALS[key]()
            if key in DEFINITION_CALLABLES:
                self.allow_call(value)
            if isinstance(value, type):
                self._definition_types[id(value)] = value  # its instances are data: NEWOBJ may make them
            return self.protect(value)
        if name.endswith(".__new__") and "." in name and module in ("enum", "builtins"):
            owner = self.find_class(module, name.rsplit(".", 1)[0])
            if isinstance(owner, type):
                return self.protect(owner.__new__)
        image_class = image_class_for(module, name)
        if image_class is not None:
            return self.protect(image_class)  # made and filled as data only (`unpickling.images`)
        if root in IMPORT_MACHINERY:
            return self.allow_call(Inert)
        if module == "builtins":
            if name not in SAFE_BUILTINS:
                raise refuse(qualified, "only data types and pure functions of builtins are")
            return self.protect(builtin(name))
        if module in ("copyreg", "copy_reg"):
            raise refuse(qualified, "copyreg reconstructors are not needed by nnsight")
        if root == "collections" or (module, name) == ("functools", "partial"):
            return self.protect(self._resolve(module, name, private_ok=False))
        if module == "__main__":
            raise refuse(qualified, (
                "the client sent this name of your script without its value, which no server "
                "can look up (Python 3.12's `type X = ...` aliases travel so): use a plain "
                "assignment, `X = ...`, or define it inside the code you send"
            ))
        if self.legacy and root in ("transformers", "diffusers"):
            return self.protect(library_class(module, name))
        if root not in self.policy.roots:
            raise refuse(
                qualified,
                f"globals must come from nnsight or the modules you may import "
                f"({self.policy.describe()})",
            )
        value = self._resolve(module, name, private_ok=root == "nnsight")
        return self.protect(value)

    def _resolve(self, module: str, name: str, private_ok: bool) -> Any:
        qualified = f"{module}.{name}"
        parts = module.split(".")[1:] + name.split(".")
        for part in parts:
            problem = attribute_problem(part)
            if problem or (part.startswith("_") and not private_ok):
                raise refuse(qualified, problem or "private names are not accepted")
        try:
            value = importlib.import_module(module)
        except Exception as error:
            raise refuse(qualified, f"the module cannot be imported here ({error})") from None
        for part in name.split("."):
            try:
                value = getattr(value, part)
            except AttributeError:
                raise refuse(qualified, self._missing_here()) from None
        return value

    def _missing_here(self) -> str:
        if self.client_python and not same_release(self.client_python):
            # A name of a newer Python (``typing.TypeAliasType`` from 3.12's ``type X = ...``).
            return (
                f"Python {server_python()} on this server has no such name, and your client "
                f"runs Python {self.client_python}"
            )
        return "no such name on this server"

    def persistent_load(self, pid: Any) -> Any:
        try:
            return self.protect(self.persistent_objects[pid])
        except (KeyError, TypeError):
            raise RefusedPayload(
                f"Your request refers to {pid!r}, which this server's model does not have. "
                "Check that you traced the same model the server serves."
            ) from None

    # -- checked replacements for the reconstructors nnsight payloads use ----------

    def _install_substitutes(self) -> None:
        substitutes = checked_reconstructors(self)
        if self.legacy:
            substitutes.update(legacy_reconstructors(self))
        for function in substitutes.values():
            self.allow_call(function)
        self._substitutes = substitutes
        for constructor in BUILTIN_CONSTRUCTORS + (
            collections.OrderedDict, collections.defaultdict, collections.deque,
            collections.Counter, functools.partial,
        ):
            self.allow_call(constructor)
        try:
            import numpy
            import torch

            for constructor in (torch.Size, torch.device, numpy.ndarray):
                self.allow_call(constructor)
        except ImportError:
            pass

    # -- the opcodes that call or write ------------------------------------------------

    dispatch = dict(_PythonUnpickler.dispatch)

    def _callable_ok(self, function: Any) -> bool:
        if id(function) in self.callables:
            return True
        if isinstance(function, type):
            # Exceptions and enums only look values up or store arguments;
            # staticmethod, classmethod and property only wrap what they are given.
            return (
                issubclass(function, BaseException)
                or isinstance(function, enum.EnumMeta)
                or function in DESCRIPTOR_TYPES
            )
        return False

    def load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        function = stack[-1]
        if function is type and isinstance(args, tuple) and len(args) == 1 and (
            args[0] is None or args[0] is Ellipsis or args[0] is NotImplemented
        ):
            stack[-1] = type(args[0])  # how cloudpickle names NoneType (``Optional[...]``)
            return
        if not self._callable_ok(function):
            raise refuse(f"a call to {describe(function)}", "only reconstructors may be called")
        if not isinstance(args, tuple):
            raise refuse("a call with malformed arguments")
        value = function(*args)
        if isinstance(function, enum.EnumMeta):
            self.protect(value)  # a member is a shared singleton
        stack[-1] = value

    dispatch[pickle.REDUCE[0]] = load_reduce

    def _check_new(self, cls: Any) -> None:
        """``cls.__new__`` runs library code with the payload's arguments: allow few classes."""
        if not isinstance(cls, type) or issubclass(cls, type):
            raise refuse(f"an instance of {describe(cls)}", "only plain classes may be made")
        if id(cls) in self.classes or cls is Inert or cls in BUILTIN_CONSTRUCTORS:
            return
        if id(cls) in self._definition_types:
            return
        if (cls.__module__ or "").split(".")[0] == "nnsight" or cls is typing.ForwardRef:
            return
        if is_image_class(cls) or (self.legacy and is_config_class(cls)):
            return
        if issubclass(cls, newobj_bases()):
            return
        raise refuse(
            f"an instance of {describe(cls)}",
            "a request may carry nnsight's objects, tensors, arrays, modules and plain data",
        )

    def load_newobj(self) -> None:
        self._check_new(self.stack[-2])
        _PythonUnpickler.load_newobj(self)

    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self) -> None:
        self._check_new(self.stack[-3])
        _PythonUnpickler.load_newobj_ex(self)

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def _check_target(self, target: Any) -> None:
        if id(target) in self.protected:
            raise refuse(
                f"a change to {describe(target)}",
                "a request may not modify the server's objects while it is read",
            )
        if isinstance(target, (type, types.ModuleType, types.FunctionType)) and not (
            id(target) in self.classes or id(target) in self.functions
        ):
            raise refuse(f"a change to {describe(target)}", "only objects it creates may be filled in")

    def load_build(self) -> None:
        target = self.stack[-2]
        self._check_target(target)
        self._check_edit(target, self.stack[-1])
        if isinstance(target, typing.ForwardRef):
            self._build_forward_ref(target, self.stack.pop())
            return
        if is_image(target):
            build_image(target, self.stack.pop())
            return
        self.stack[-1] = translate_state(target, self.stack[-1])
        try:
            _PythonUnpickler.load_build(self)
        except AttributeError as error:
            # A name the client's Python records and this one's class has no room for.
            if not self.client_python or same_release(self.client_python):
                raise
            raise cannot_express(target, error, self.client_python) from None

    def _build_forward_ref(self, target: typing.ForwardRef, state: Any) -> None:
        """An annotation's ``"TreeNode"``: rebuilt from its text, never from the sent code.

        A ForwardRef carries the code object compiled from its text, which
        arrives as bytecode; the text is compiled again here (``compile`` only,
        as ``typing`` does), and no module is named for its evaluation.
        """
        slots = state[1] if isinstance(state, tuple) and len(state) == 2 else state
        text = slots.get("__forward_arg__") if isinstance(slots, dict) else None
        if not isinstance(text, str) or len(text) > 10_000:
            raise refuse("a malformed type annotation")
        try:
            fresh = typing.ForwardRef(
                text,
                is_argument=bool(slots.get("__forward_is_argument__", True)),
                is_class=bool(slots.get("__forward_is_class__", False)),
            )
        except SyntaxError:
            raise refuse(f"the type annotation {text!r}", "it is not a Python expression") from None
        for slot in typing.ForwardRef.__slots__:
            if hasattr(fresh, slot):
                setattr(target, slot, getattr(fresh, slot))

    def _check_edit(self, target: Any, state: Any) -> None:
        """An nnsight edit (``envoy.edit``) compiles its source when it is unpickled.

        Its source is held to the same rules as the traced block's, and it gets
        the same guarded builtins, before nnsight compiles it.
        """
        from nnsight.intervention.interleaver import Mediator  # type: ignore[import-untyped]

        # 0.6 and 0.7 ship no edits' source: their functions are checked as they are made.
        if self.legacy or not isinstance(target, Mediator):
            return
        reduced = state.get("reduced") if isinstance(state, dict) else None
        if not (isinstance(reduced, tuple) and len(reduced) == 3):
            raise refuse("a malformed edit")
        source, namespace, variables = reduced
        if not (isinstance(source, str) and isinstance(namespace, dict) and isinstance(variables, dict)):
            raise refuse("a malformed edit")
        check_source(source, "<edit>", self.policy, self.syntax_note)
        if self.policy.enabled:
            namespace.pop("__builtins__", None)
            install_builtins(namespace, self.builtins_dict)
            install_builtins(variables, self.builtins_dict)

    dispatch[pickle.BUILD[0]] = load_build

    def load_setitem(self) -> None:
        self._check_target(self.stack[-3])
        _PythonUnpickler.load_setitem(self)

    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_append(self) -> None:
        self._check_target(self.stack[-2])
        _PythonUnpickler.load_append(self)

    dispatch[pickle.APPEND[0]] = load_append

    def _check_marked_target(self) -> None:
        # SETITEMS / APPENDS / ADDITEMS write into the object below the last mark.
        if self.metastack:
            below = self.metastack[-1]
            if below:
                self._check_target(below[-1])

    def load_setitems(self) -> None:
        self._check_marked_target()
        _PythonUnpickler.load_setitems(self)

    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_appends(self) -> None:
        self._check_marked_target()
        _PythonUnpickler.load_appends(self)

    dispatch[pickle.APPENDS[0]] = load_appends

    def load_additems(self) -> None:
        self._check_marked_target()
        _PythonUnpickler.load_additems(self)

    dispatch[pickle.ADDITEMS[0]] = load_additems

    def _refuse_opcode(self) -> None:
        raise refuse("an old pickle opcode (INST, OBJ or an extension code)", "nnsight uses protocol 4")

    def load_frame(self) -> None:
        # A frame is a length before a run of opcodes, so that a reader of a
        # stream can fetch the run at once; the opcodes read the same without
        # it. The payload is already in memory, and pickle's per-frame buffer
        # cost a Python call on every read of every opcode (about two thirds
        # of a small payload's load): `_run_opcodes` reads the payload itself,
        # and a frame is only its length, skipped.
        if len(self._file_read(8)) != 8:
            raise pickle.UnpicklingError("the payload ends inside a frame's length")

    dispatch[pickle.FRAME[0]] = load_frame

    def load_stop(self) -> None:
        raise _Loaded(self.stack.pop())

    dispatch[pickle.STOP[0]] = load_stop

    for _opcode in (pickle.INST, pickle.OBJ, pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_opcode[0]] = _refuse_opcode
    del _opcode

    # -- the whole payload ---------------------------------------------------------------

    def load(self) -> Any:
        # Library code that evaluates strings (sympy, typing) treats what runs
        # during the load as user code: a payload's objects are the user's.
        with untrusted():
            result = self._run_opcodes()
        # What was not built is refused first: it says more than a wrong shape.
        self._refuse_what_is_still_needed()
        return self._check_payload(result)

    def _run_opcodes(self) -> Any:
        """pickle's own loop of opcodes, with every read straight from the payload.

        ``pickle._Unpickler.load`` puts its frame buffer between each read and
        the payload, a Python call per opcode even once `load_frame` has
        emptied it; the opcodes themselves, overridden or not, are the same.
        """
        read = self.read = self._file_read
        self.readline = self._file_readline
        self.readinto = self._read_into
        self.metastack, self.stack = [], []
        self.append = self.stack.append
        self.proto = 0
        dispatch = self.dispatch
        try:
            while True:
                opcode = read(1)
                if not opcode:
                    raise EOFError("the payload ends before its STOP opcode")
                dispatch[opcode[0]](self)
        except _Loaded as loaded:
            return loaded.value

    def _read_into(self, buffer: Any) -> int:
        size = len(buffer)
        buffer[:] = self._file_read(size)
        return size

    def _refuse_what_is_still_needed(self) -> None:
        """Refuse the payload if a part that was not built is still reachable from it."""
        if not self._deferred:
            return
        # Drop the load's own references (memo, registries), then see what lives.
        self.memo.clear()
        for registry in (self.protected, self.functions, self.classes, self.callables, self.sources,
                         self._definition_types):
            registry.clear()
        gc.collect()
        alive = [ref() for ref in self._deferred]
        needed = [placeholder for placeholder in alive if placeholder is not None]
        self._deferred.clear()
        if needed:
            raise needed[0].refusal()

    def _check_payload(self, result: Any) -> Any:
        """The payload's shape, the block's source, and the builtins it will run with."""
        if self.legacy:
            return check_request(self, result)
        from nnsight.tracing.tracer import Tracer  # type: ignore[import-untyped]
        from nnsight.tracing.util import SerializedFrame  # type: ignore[import-untyped]

        shape_error = refuse("something that is not an nnsight trace")
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
        code: Any = getattr(frame, "f_code", None)
        if not isinstance(frame, SerializedFrame) or not isinstance(
            getattr(code, "co_filename", None), str
        ) or not isinstance(getattr(code, "co_name", None), str):
            raise shape_error
        check_source(source, code.co_filename, self.policy, self.syntax_note)
        if self.policy.enabled:
            namespace.pop("__builtins__", None)
            # The block runs with these as its globals *and* (through nnsight's
            # Scope) its locals; exec reads __builtins__ from the latter.
            install_builtins(namespace, self.builtins_dict)
            install_builtins(variables, self.builtins_dict)
        return result


def restricted_unpickler(policy: SandboxPolicy) -> type[RestrictedUnpickler]:
    """A `RestrictedUnpickler` class bound to ``policy`` (what `deserialize` instantiates)."""
    return cast(
        "type[RestrictedUnpickler]",
        type(
            "RestrictedUnpickler",
            (RestrictedUnpickler,),
            {"policy": policy, "builtins_dict": guarded_builtins(policy),
             "legacy": current().generation != Current.generation},
        ),
    )

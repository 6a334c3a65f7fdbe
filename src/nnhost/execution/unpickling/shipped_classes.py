"""Code a request ships by value, rebuilt as the user wrote it.

nnsight sends a function from the user's script as its source and a class as
cloudpickle does: an empty skeleton, then its attributes. Three things about
that need the server's help to give the code the user wrote:

* **Methods are sent as source and compiled at module level**, outside their
  class: ``super()`` then finds no ``__class__`` cell and ``self.__secret`` is
  not mangled. `rebind_methods` compiles each shipped method again inside a
  class of the same name, so both work as they do locally.
* **Library-made methods have no source.** A named tuple's ``__new__`` and a
  dataclass's ``__init__``/``__repr__``/``__eq__`` were generated with ``exec``
  on the client; cloudpickle can only send them as bytecode, which the server
  never builds (they arrive as `Unavailable`). `library_template` makes
  them again here, with ``collections.namedtuple`` and ``dataclasses`` from the
  field names (checked to be identifiers first: both libraries write the names
  into the source they compile).
* **Results go back to the client's own class.** `remember_client_class`
  records the id the client's cloudpickle gave a class it sent;
  `client_class_id` lets the result pickler send that id back, so the client
  resolves the instance to its own class instead of a copy.

Everything here runs in the job's contained process, on the payload of one
job; it must never keep a class across jobs, nor build code from bytecode.
"""

from __future__ import annotations

import keyword
import textwrap
import types
import weakref
from typing import Any, Callable, Optional

from .allowlist import RefusedPayload

#: The class ids the client's cloudpickle gave the classes it shipped (one job per process).
_CLIENT_IDS: "weakref.WeakKeyDictionary[type, str]" = weakref.WeakKeyDictionary()


class Unavailable:
    """An inert stand-in for a part of the payload the server would not build.

    The part (a function sent as bytecode, a function whose source breaks the
    rules, a module that may not be imported) is refused only if it is still
    part of the payload once the load is over: a library-made method the server
    makes again replaces its stand-in. Using it in any way raises the refusal.
    """

    __slots__ = ("reason", "__weakref__")

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def refusal(self) -> Exception:
        return RefusedPayload(self.reason)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self.refusal()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            # Wrappers (staticmethod) copy a function's __name__, __doc__, ... if present.
            raise AttributeError(name)
        raise self.refusal()

    def __repr__(self) -> str:
        return "<refused part of the request>"


def remember_client_class(cls: type, client_id: Any) -> None:
    if isinstance(client_id, str) and 0 < len(client_id) <= 64:
        _CLIENT_IDS[cls] = client_id


def client_class_id(cls: type) -> Optional[str]:
    """The id the client's cloudpickle knows ``cls`` by, if the client shipped it."""
    try:
        return _CLIENT_IDS.get(cls)
    except TypeError:
        return None


# --- methods compiled inside their class ---------------------------------------------


def _method_code(source: str, name: str, class_name: str, filename: str, line: int) -> Optional[types.CodeType]:
    """The code of ``def name`` compiled inside ``class class_name:``, at its original line."""
    header = f"class {class_name}:\n"
    padding = "\n" * max(line - 2, 0)
    module = compile(padding + header + textwrap.indent(source, "    "), filename, "exec")
    for const in module.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == class_name:
            found = None
            for inner in const.co_consts:
                if isinstance(inner, types.CodeType) and inner.co_name == name:
                    found = inner
            return found
    return None


def rebind_methods(cls: type, state: dict[str, Any], sources: dict[int, tuple[str, str, str, int]]) -> None:
    """Replace each shipped method in ``state`` by one compiled inside ``cls``.

    ``sources`` maps ``id(function)`` to ``(source, name, filename, line)`` for
    the functions this load compiled from source; other values are left alone.
    """
    class_name = cls.__name__ if cls.__name__.isidentifier() else "_"

    def rebuilt(function: Any) -> Any:
        info = sources.get(id(function)) if isinstance(function, types.FunctionType) else None
        if info is None:
            return function
        source, name, filename, line = info
        try:
            code = _method_code(source, name, class_name, filename, line)
        except SyntaxError:
            return function
        if code is None or code.co_freevars not in ((), ("__class__",)):
            return function
        closure = (types.CellType(cls),) if code.co_freevars else None
        method = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__, closure)
        method.__kwdefaults__ = function.__kwdefaults__
        method.__annotations__ = function.__annotations__
        method.__qualname__ = f"{cls.__qualname__}.{function.__name__}"
        method.__dict__.update(function.__dict__)
        sources[id(method)] = info
        return method

    for attribute, value in list(state.items()):
        if isinstance(value, staticmethod):
            state[attribute] = staticmethod(rebuilt(value.__func__))
        elif isinstance(value, classmethod):
            state[attribute] = classmethod(rebuilt(value.__func__))
        elif isinstance(value, property):
            state[attribute] = property(
                rebuilt(value.fget), rebuilt(value.fset), rebuilt(value.fdel), value.__doc__
            )
        else:
            state[attribute] = rebuilt(value)


# --- classes their library builds: named tuples and dataclasses --------------------------


def _check_names(names: Any, what: str) -> list[str]:
    if not isinstance(names, (tuple, list, dict)):
        raise _malformed(what)
    checked = []
    for name in names:
        if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
            raise RefusedPayload(
                f"Your request's payload has a {what} with a field named {name!r}, "
                "which is not a Python identifier."
            )
        checked.append(name)
    return checked


def is_unavailable(value: Any) -> bool:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    return isinstance(value, Unavailable)


#: What ``dataclasses`` writes into a class (its ``exec``-made methods and their data).
DATACLASS_GENERATED = frozenset(
    "__init__ __repr__ __eq__ __lt__ __le__ __gt__ __ge__ __hash__ __setattr__ __delattr__ "
    "__match_args__ __getstate__ __setstate__ __replace__".split()
)


def library_template(cls: type, state: dict[str, Any]) -> Optional[tuple[frozenset[str], Callable[[type], None]]]:
    """What ``cls``'s library generated, and how to make it again once its state is set.

    Of the attributes in ``state`` that arrived as `Unavailable` (bytecode, or a
    library's source the rules refuse), those the library generates are left
    out and made again by the returned function; any other attribute (the
    user's own methods) stays as sent, to be refused if it is unavailable.
    """
    if "__dataclass_fields__" in state and "__dataclass_params__" in state:
        return DATACLASS_GENERATED, lambda target: _complete_dataclass(target, state)
    if tuple in cls.__mro__ and "_fields" in state:
        fields = _check_names(state["_fields"], "named tuple")
        defaults = state.get("_field_defaults") or {}
        if not isinstance(defaults, dict):
            raise _malformed("named tuple")
        template = _named_tuple(cls.__name__, fields, defaults)
        generated = frozenset(vars(template)) - {"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__"}
        kept = {name for name, value in state.items() if not (name in generated and is_unavailable(value))}
        return generated, lambda target: _complete_named_tuple(target, template, generated - kept)
    return None


def _malformed(what: str) -> Exception:
    return RefusedPayload(f"Your request's payload has a malformed {what}.")


def _named_tuple(name: str, fields: list[str], defaults: dict[str, Any]) -> type:
    import collections

    ordered = [defaults[field] for field in fields if field in defaults]
    try:
        return collections.namedtuple(name if name.isidentifier() else "_", fields, defaults=ordered or None)
    except (TypeError, ValueError) as error:
        raise _malformed(f"named tuple ({error})") from None


def _complete_named_tuple(cls: type, template: type, missing: frozenset[str]) -> None:
    for name in missing:
        setattr(cls, name, vars(template)[name])


def _complete_dataclass(cls: type, state: dict[str, Any]) -> None:
    import dataclasses
    import inspect

    fields = state["__dataclass_fields__"]
    params = state["__dataclass_params__"]
    if not isinstance(fields, dict):
        raise _malformed("dataclass")
    annotations = cls.__dict__.get("__annotations__", {})
    _check_names(fields, "dataclass")
    _check_names(annotations, "dataclass")
    for name, item in fields.items():
        if not isinstance(item, dataclasses.Field):
            raise _malformed("dataclass")
        if name in annotations:
            # Where dataclasses reads a field's default, factory and options from.
            setattr(cls, name, item)
    for name in ("__dataclass_fields__", "__dataclass_params__"):
        if name in cls.__dict__:
            delattr(cls, name)
    options = {}
    accepted = inspect.signature(dataclasses.dataclass).parameters
    for option in ("init", "repr", "eq", "order", "unsafe_hash", "frozen", "match_args", "kw_only"):
        value = getattr(params, option, None)
        if option in accepted and isinstance(value, bool):
            options[option] = value
    # dataclasses reads the annotations again, and a text annotation
    # ("dataclasses.InitVar[float]", under ``from __future__ import annotations``)
    # names a ClassVar, an InitVar or the KW_ONLY marker only through the module
    # the class was written in, which is the client's. The client's own fields
    # say what each one was: its annotations are those, for as long as this runs.
    sent = cls.__dict__.get("__annotations__")
    cls.__annotations__ = _annotations_as_recorded(annotations, fields)
    try:
        dataclasses.dataclass(cls, **options)
    finally:
        if sent is not None:
            cls.__annotations__ = sent


def _annotations_as_recorded(annotations: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """The class's annotations, each made to mean what the client's dataclasses took it for.

    A name with no field is the ``KW_ONLY`` marker (every field after it
    carries its own ``kw_only``), and is left out.
    """
    import dataclasses
    import typing

    class_var = getattr(dataclasses, "_FIELD_CLASSVAR", None)
    init_var = getattr(dataclasses, "_FIELD_INITVAR", None)
    recorded: dict[str, Any] = {}
    for name, annotation in dict(annotations).items():
        item = fields.get(name)
        if item is None:
            continue
        kind = getattr(item, "_field_type", None)
        if kind is class_var and class_var is not None:
            recorded[name] = typing.ClassVar
        elif kind is init_var and init_var is not None and not isinstance(annotation, dataclasses.InitVar):
            recorded[name] = dataclasses.InitVar(annotation)
        else:
            recorded[name] = annotation
    return recorded

"""Closing the string-evaluating paths of allowed libraries.

``typing`` evaluates forward references with ``eval``, and sympy's parser
evaluates the text it is given with full builtins; both are reachable from
allowed imports. dataclasses compiles source made of its field names, which
`check_field_names` holds to identifiers. `harden_libraries` routes those strings through the
sandbox's `check_source` first; `untrusted` marks the thread while a payload is
unpickled, so that what runs then counts as user code.

It must never refuse a library's own strings (only those user code had
evaluated), and never be undone once applied in a worker.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from typing import Any, Iterator, Optional, cast

from .sandbox import SandboxPolicy, check_source

_HARDENED: list[str] = []


_UNTRUSTED = threading.local()


@contextlib.contextmanager
def untrusted() -> Iterator[None]:
    """Mark this thread as working on the payload's behalf (while it is unpickled)."""
    previous = getattr(_UNTRUSTED, "active", False)
    _UNTRUSTED.active = True
    try:
        yield
    finally:
        _UNTRUSTED.active = previous


def _called_from_user_code(user_builtins: dict[str, Any]) -> bool:
    """Whether a frame of user code (it runs with ``user_builtins``) is on the stack."""
    if getattr(_UNTRUSTED, "active", False):
        return True
    frame: Optional[types.FrameType] = sys._getframe(2)
    while frame is not None:
        if frame.f_builtins is user_builtins:
            return True
        frame = frame.f_back
    return False


def _check_expression(text: Any, policy: SandboxPolicy, where: str, user_builtins: dict[str, Any]) -> None:
    # Only strings user code had evaluated: libraries keep evaluating their own
    # annotations as they always have.
    if isinstance(text, str) and _called_from_user_code(user_builtins):
        check_source(text, where, policy)


def check_field_names(cls: Any) -> None:
    """Refuse a dataclass whose field names are not identifiers.

    dataclasses writes each field's name into the source of the ``__init__``,
    ``__repr__`` and comparisons it compiles with the real builtins; a name
    such as ``"x=__import__('os')"`` would be code. Python's own checks stop
    only some of them.
    """
    import keyword

    from .sandbox import SandboxViolation

    annotations = getattr(cls, "__dict__", {}).get("__annotations__", {})
    for name in annotations:
        if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
            raise SandboxViolation(
                f"A dataclass field must be named by a Python identifier, not {name!r}."
            )


def _harden_dataclasses() -> None:
    import dataclasses

    original = getattr(dataclasses, "_process_class", None)
    if original is None:  # a dataclasses laid out differently: the shipped ones are checked anyway
        return

    def _process_class(cls: Any, *args: Any, **kwargs: Any) -> Any:
        check_field_names(cls)
        return original(cls, *args, **kwargs)

    cast(Any, dataclasses)._process_class = _process_class  # a private name typeshed leaves out
    _HARDENED.append("dataclasses._process_class")


def harden_libraries(policy: SandboxPolicy, user_builtins: dict[str, Any]) -> list[str]:
    """Route the string evaluators of allowed libraries through `check_source`.

    ``typing`` evaluates forward references with ``eval`` in its own globals,
    and sympy's parser (behind ``sympify`` and every function that accepts a
    string) evaluates the parsed text with full builtins. Both are reachable
    from allowed imports, so the text is checked first, and sympy's evaluation
    gets the guarded builtins.
    """
    if not policy.enabled or _HARDENED:
        return list(_HARDENED)
    import typing

    original_evaluate = typing.ForwardRef._evaluate

    def _evaluate(self: typing.ForwardRef, *args: Any, **kwargs: Any) -> Any:
        _check_expression(self.__forward_arg__, policy, "<type annotation>", user_builtins)
        return original_evaluate(self, *args, **kwargs)

    cast(Any, typing.ForwardRef)._evaluate = _evaluate  # replaces the method for every ForwardRef
    _HARDENED.append("typing.ForwardRef")
    _harden_dataclasses()
    try:
        from sympy.parsing import sympy_parser  # type: ignore[import-untyped]
    except Exception:  # sympy missing: nothing to harden
        return list(_HARDENED)
    original_stringify = sympy_parser.stringify_expr
    original_eval_expr = sympy_parser.eval_expr

    # sympy's parser is checked whoever calls it: its strings come from users
    # (directly, or through a sympy object's constructor), never from torch.
    def stringify_expr(*args: Any, **kwargs: Any) -> Any:
        # The Python text sympy is about to compile, whether it then evaluates
        # it directly or rewrites it first (``evaluate=False``).
        code = original_stringify(*args, **kwargs)
        if isinstance(code, str):
            check_source(code, "<sympy expression>", policy)
        return code

    def eval_expr(code: Any, local_dict: Any, global_dict: Any) -> Any:
        if isinstance(code, str):
            check_source(code, "<sympy expression>", policy)
        global_dict = dict(global_dict)
        global_dict["__builtins__"] = user_builtins
        return original_eval_expr(code, local_dict, global_dict)

    sympy_parser.stringify_expr = stringify_expr
    sympy_parser.eval_expr = eval_expr
    _HARDENED.append("sympy.parsing.sympy_parser.eval_expr")
    return list(_HARDENED)

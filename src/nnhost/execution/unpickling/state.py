"""The part of one load the checked reconstructors may read and record into.

Why it exists: the restricted unpickler (`unpickler`) builds its
reconstructors (`reconstructors`, `legacy`) for each load and hands them the
load itself. They need its registries and its policy, not the unpickler's
class; naming that here, as a protocol the unpickler satisfies, keeps the
unpickler the only module that imports them.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from ..python_layer.sandbox import SandboxPolicy
from .shipped_classes import Unavailable

_T = TypeVar("_T")


class Load(Protocol):
    """One load in progress: what it allows, and what it has made so far (registries by id)."""

    policy: SandboxPolicy
    builtins_dict: dict[str, Any]
    #: What ends a refusal of shipped source this Python cannot parse.
    syntax_note: str
    protected: dict[int, Any]
    functions: dict[int, Any]
    classes: dict[int, Any]
    callables: dict[int, Any]
    sources: dict[int, tuple[str, str, str, int]]

    def protect(self, obj: _T) -> _T: ...

    def allow_call(self, obj: _T) -> _T: ...

    def defer(self, reason: str) -> Unavailable: ...

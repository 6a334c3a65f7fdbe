"""Identity snapshots of attribute dicts: what `ModelGuard` compares and puts back.

One `DictSnapshot` holds an object's attribute dict (a module's, a class's,
the tokenizer's, nnsight's ``CONFIG``'s) by identity, one level into the
containers it holds, so that a hook registered in ``_forward_hooks`` counts as
a change. `restore` puts every key back as it was and says what changed.

It must never copy or compare values deeply (a snapshot is taken per placement
and compared per job, in milliseconds), and never decide what to snapshot or
whether a change is fatal: `integrity` does.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Iterable, Optional, cast

if TYPE_CHECKING:
    from .report import GuardReport

_CONTAINERS = (dict, list, set)


class DictSnapshot:
    """Identity snapshot of one object's attribute dict, one level into containers."""

    __slots__ = ("owner", "name", "items", "contents", "quiet")

    def __init__(self, owner: Any, name: str, quiet: Iterable[str] = ()) -> None:
        self.owner = owner
        self.name = name
        #: Keys the library itself resets on every run: put back without a report.
        self.quiet = quiet if isinstance(quiet, frozenset) else frozenset(quiet)
        namespace = attribute_namespace(owner)
        # Callers snapshot owners that have one (``dict(None)`` raises otherwise).
        self.items = dict(cast(dict[str, Any], namespace))
        self.contents = {
            key: (list(value.items()) if isinstance(value, dict) else list(value))
            for key, value in self.items.items()
            if type(value) in _CONTAINERS or isinstance(value, dict)
        }

    def restore(self, report: GuardReport, deep: bool = True) -> None:
        namespace = attribute_namespace(self.owner)
        if namespace is None:
            return
        changed = []
        for key in [k for k in namespace if k not in self.items]:
            if key in _CACHES or isinstance(self.owner, types.ModuleType):
                # Written by the interpreter itself (copyreg, warnings), or a
                # submodule the import system bound on its package.
                continue
            if key not in self.quiet and not _inherited(self.owner, key, namespace[key]):
                changed.append(f"added {key}")
            _delete(self.owner, namespace, key)
        for key, value in self.items.items():
            if key not in namespace or not _same(namespace[key], value):
                if key not in self.quiet:
                    changed.append(f"replaced {key}")
                _assign(self.owner, namespace, key, value)
        if deep:
            for key, content in self.contents.items():
                container = self.items[key]
                if _same_contents(container, content):
                    continue
                if key not in self.quiet:
                    changed.append(f"changed {key}")
                if isinstance(container, dict):
                    container.clear()
                    container.update(content)
                elif isinstance(container, list):
                    container[:] = content
                else:
                    container.clear()
                    container.update(content)
        if changed:
            report.restored.append(f"{self.name}: {', '.join(changed[:4])}")


_PRIMITIVES = (str, int, float, bool, bytes, type(None))
_CACHES = frozenset({"__slotnames__", "__warningregistry__"})


class AllKeys(frozenset[str]):
    """A ``quiet`` set that contains every key."""

    def __contains__(self, key: object) -> bool:
        return True


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and type(a) in _PRIMITIVES and a == b)


def _inherited(owner: Any, key: str, value: Any) -> bool:
    """Whether ``value``, newly in a class's dict, is what its bases give it anyway.

    Lookup on the class then finds the same object as before, so nothing
    changed: nnsight's backward tracing, for one, puts ``torch.Tensor.grad``
    back by assigning the descriptor the class inherits, which leaves it in
    ``Tensor``'s own dict. Removing it is still right; reporting it is not.
    """
    if not isinstance(owner, type):
        return False
    for base in owner.__mro__[1:]:
        if key in base.__dict__:
            return base.__dict__[key] is value
    return False


def attribute_namespace(owner: Any) -> Optional[dict[str, Any]]:
    if isinstance(owner, type):
        return dict(owner.__dict__)
    try:
        namespace: dict[str, Any] = object.__getattribute__(owner, "__dict__")
        return namespace
    except AttributeError:
        return None


def _assign(owner: Any, namespace: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(owner, type):
        type.__setattr__(owner, key, value)
    else:
        namespace[key] = value


def _delete(owner: Any, namespace: dict[str, Any], key: str) -> None:
    if isinstance(owner, type):
        type.__delattr__(owner, key)
    else:
        namespace.pop(key, None)


def _same_contents(container: Any, content: list[Any]) -> bool:
    if isinstance(container, dict):
        if len(container) != len(content):
            return False
        return all(container.get(k, _MISSING) is v for k, v in content)
    if isinstance(container, list):
        return len(container) == len(content) and all(a is b for a, b in zip(container, content))
    return len(container) == len(content) and all(item in container for item in content)


_MISSING = object()

"""What untrusted code may import and touch, checked in Python before and while it runs.

A request is a stranger's Python. This module is the *Python-level* layer of
its containment: a speed bump that turns the obvious escapes into clear,
early refusals, not the boundary itself. Python offers too many doors (every
allowed library reaches ``os`` somewhere, and some evaluate strings), so the
operating-system layers in `containment` are what actually keep a request away
from the network, the disk and the server's secrets. Both are needed: this
layer gives users a readable reason, the other holds when this one is beaten.

What it does:

* `SandboxPolicy` says which top-level modules user code may import (the
  operator's ``allowed_imports`` plus ``nnsight`` itself, which every payload
  references).
* `check_source` parses the traced block, and every function shipped by value,
  and refuses: imports outside the policy; dunder attributes (``__class__``,
  ``__globals__``, ``__subclasses__``, ...) except a few harmless protocol
  methods; frame and code introspection (``tb_frame``, ``f_globals``, ...);
  attribute names that lead to modules or functions which read files, load
  pickles or evaluate strings (``torch.os``, ``np.load``, ``sympy.lambdify``);
  the builtins ``eval``, ``exec``, ``compile``, ``open``, ``globals``, ``vars``
  and friends; ``__del__`` methods (a finaliser would run during a later job).
* `guarded_builtins` is the ``__builtins__`` user code runs with: without the
  refused builtins, with an ``__import__`` that applies the policy at run time
  (for imports inside shipped functions, or spelled dynamically), and with
  ``getattr``/``setattr``/``delattr``/``hasattr`` that apply the attribute rules
  to names computed at run time.
* `harden_libraries` (in `library_hardening`) closes the string-evaluating
  paths of allowed libraries (``typing`` forward references, ``sympy``'s
  parser) by checking the string with the same rules before it is evaluated.

The rules themselves, as tables (which imports, attributes, names and methods
are refused), are in `sandbox_rules`; this module applies them.

It never decides anything about the worker process: see `containment`.
"""

from __future__ import annotations

import ast
import builtins as _builtins
import dis
import functools
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from .sandbox_rules import (
    DEFAULT_ALLOWED_IMPORTS,
    DENIED_ATTRIBUTES,
    DENIED_METHODS,
    DENIED_NAMES,
    LAZY_SUBMODULES,
    PROTOCOL_MODULES,
    PROTOCOL_NAMES,
    REMOVED_BUILTINS,
    SAFE_DUNDERS,
)


class SandboxViolation(Exception):
    """User code asked for something this server does not allow."""


class ImportRefused(SandboxViolation, ImportError):
    """An import outside the allowed list (also an ImportError, as users expect)."""


class AttributeRefused(SandboxViolation, AttributeError):
    """An attribute name the sandbox refuses."""


@dataclass(frozen=True)
class SandboxPolicy:
    """What user code may import; the rest of the rules are fixed."""

    allowed_imports: tuple[str, ...] = DEFAULT_ALLOWED_IMPORTS
    #: Check sources and guard builtins (False: trusted deployment, run as is).
    enabled: bool = True
    roots: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = tuple(dict.fromkeys(name.strip() for name in self.allowed_imports if name.strip()))
        object.__setattr__(self, "allowed_imports", names)
        roots = {name.split(".")[0] for name in names} | set(PROTOCOL_MODULES)
        object.__setattr__(self, "roots", frozenset(roots))

    @classmethod
    def from_names(cls, names: Optional[Iterable[str]], enabled: bool = True) -> "SandboxPolicy":
        return cls(tuple(names) if names else DEFAULT_ALLOWED_IMPORTS, enabled)

    def describe(self) -> str:
        return ", ".join(self.allowed_imports)

    def import_problem(self, name: str) -> Optional[str]:
        """Why ``import name`` is refused, or None when it is allowed."""
        if not isinstance(name, str) or not name:
            return "an import needs a module name"
        parts = name.split(".")
        if parts[0] not in self.roots:
            return (
                f"importing {name!r} is not allowed on this server. Modules you may "
                f"import: {self.describe()} (and nnsight)."
            )
        for part in parts[1:]:
            if part.startswith("_") or part in DENIED_ATTRIBUTES:
                return (
                    f"importing {name!r} is not allowed on this server: {part!r} is a "
                    "private or refused part of the package."
                )
        return None

    def check_import(self, name: str) -> None:
        problem = self.import_problem(name)
        if problem:
            raise ImportRefused(problem)


def attribute_problem(name: Any) -> Optional[str]:
    """Why attribute ``name`` is refused, or None when user code may use it."""
    if not isinstance(name, str):
        return "attribute names must be strings"
    if name.startswith("__") and name.endswith("__") and name not in SAFE_DUNDERS:
        return f"the attribute {name!r} is not available on this server (introspection is refused)"
    if name in DENIED_ATTRIBUTES:
        return (
            f"the attribute {name!r} is not available on this server (it leads to files, "
            "processes, pickles or the interpreter's internals)"
        )
    return None


def check_attribute(name: Any) -> None:
    problem = attribute_problem(name)
    if problem:
        raise AttributeRefused(problem)


# --- static check of the source ---------------------------------------------------


class _Checker(ast.NodeVisitor):
    def __init__(self, policy: SandboxPolicy) -> None:
        self.policy = policy
        self.problems: list[tuple[int, str]] = []

    def refuse(self, node: ast.AST, message: str) -> None:
        self.problems.append((getattr(node, "lineno", 0), message))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        problem = attribute_problem(node.attr)
        if problem:
            self.refuse(node, problem)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if name in DENIED_NAMES:
            self.refuse(node, f"{name!r} is not available on this server")
        elif name.startswith("__") and name.endswith("__") and name != "__name__" and name not in PROTOCOL_NAMES:
            self.refuse(node, f"the name {name!r} is not available on this server")
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            problem = self.policy.import_problem(alias.name)
            if problem:
                self.refuse(node, problem)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.refuse(node, "relative imports are not available on this server")
            return
        problem = self.policy.import_problem(node.module or "")
        if problem:
            self.refuse(node, problem)
        for alias in node.names:
            if alias.name == "*":
                self.refuse(node, "`from ... import *` is not available on this server")
                continue
            problem = attribute_problem(alias.name)
            if problem:
                self.refuse(node, problem)
        self.generic_visit(node)

    def _check_function(self, node: Any) -> None:
        if node.name in DENIED_METHODS:
            self.refuse(node, f"defining {node.name} is not allowed on this server")
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _check_function

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for name in node.kwd_attrs:
            problem = attribute_problem(name)
            if problem:
                self.refuse(node, problem)
        self.generic_visit(node)


#: Longer sources are checked every time rather than remembered (`_remembered_verdict`).
_VERDICT_SOURCE_CHARS = 1 << 16


def check_source(source: str, filename: str, policy: SandboxPolicy, syntax_note: str = "") -> None:
    """Refuse ``source`` (a traced block or a shipped function) if it breaks the rules.

    Raises `SandboxViolation` listing every refused line, so a user fixes them
    all at once rather than one per request. ``syntax_note`` ends the message
    of source that does not parse (the client's Python is newer than ours).
    """
    if not policy.enabled:
        return
    judge = _remembered_verdict if len(source) <= _VERDICT_SOURCE_CHARS else _verdict
    verdict = judge(source, filename, policy, syntax_note)
    if verdict is not None:
        raise SandboxViolation(verdict)


def _verdict(source: str, filename: str, policy: SandboxPolicy, syntax_note: str) -> Optional[str]:
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as error:
        return f"{filename}, line {error.lineno}: {error.msg}{syntax_note}"
    checker = _Checker(policy)
    checker.visit(tree)
    if not checker.problems:
        return None
    lines = "\n".join(
        f"  {filename}, line {line}: {message}"
        for line, message in sorted(dict.fromkeys(checker.problems))
    )
    return "Your request uses something this server does not allow:\n" + lines


#: `_verdict` remembered by everything it reads. A user's loop of traces ships the
#: same sources to the same job process each time, and parsing and walking them is
#: a large part of reading a small request; the verdict is a function of its
#: arguments alone, so a remembered one is the same verdict.
_remembered_verdict = functools.lru_cache(maxsize=256)(_verdict)


# --- the builtins user code runs with ---------------------------------------------


def guarded_builtins(policy: SandboxPolicy) -> dict[str, Any]:
    """A ``__builtins__`` dict for user code: the policy applied at run time."""
    real_import = _builtins.__import__
    real_getattr, real_setattr, real_delattr = _builtins.getattr, _builtins.setattr, _builtins.delattr
    namespace = {
        name: value for name, value in vars(_builtins).items() if name not in REMOVED_BUILTINS
    }

    def __import__(  # noqa: A001
        name: str,
        globals: Optional[Mapping[str, object]] = None,
        locals: Optional[Mapping[str, object]] = None,
        fromlist: Sequence[str] = (),
        level: int = 0,
    ) -> types.ModuleType:
        if level:
            raise ImportRefused("relative imports are not available on this server")
        if not fromlist and not _written_import(sys._getframe(1)):
            # A library's C code importing on its own behalf (numpy's ``ndarray.mean``
            # loading ``numpy._core._methods``) calls the current frame's
            # ``__import__``, which is ours when that frame is user code. Its
            # package must still be one the user may import; the submodule is
            # the package's business. Only the package itself is returned (the
            # caller reads the submodule from ``sys.modules``), so this path
            # hands user code nothing it could not import itself.
            if name.split(".")[0] not in policy.roots:
                policy.check_import(name)
            return real_import(name, None, None, (), 0)
        policy.check_import(name)
        for item in fromlist or ():
            if item == "*":
                raise ImportRefused("`from ... import *` is not available on this server")
            check_attribute(item)
        if name.split(".")[0] == "builtins":
            # A fresh module each time: what one request sets on it, no other sees.
            module = types.ModuleType("builtins", "The builtins this server allows.")
            vars(module).update({k: v for k, v in namespace.items() if not k.startswith("__")})
            return module
        return real_import(name, None, None, fromlist, 0)

    def getattr(obj: Any, name: str, *default: Any) -> Any:  # noqa: A001
        check_attribute(name)
        return real_getattr(obj, name, *default)

    def hasattr(obj: Any, name: str) -> bool:  # noqa: A001
        check_attribute(name)
        try:
            real_getattr(obj, name)
        except AttributeError:
            return False
        return True

    def setattr(obj: Any, name: str, value: Any) -> None:  # noqa: A001
        check_attribute(name)
        real_setattr(obj, name, value)

    def delattr(obj: Any, name: str) -> None:  # noqa: A001
        check_attribute(name)
        real_delattr(obj, name)

    namespace.update(
        __import__=__import__, getattr=getattr, hasattr=hasattr, setattr=setattr, delattr=delattr
    )
    return namespace


_IMPORT_NAME = dis.opmap["IMPORT_NAME"]


def _written_import(frame: types.FrameType) -> bool:
    """Whether ``frame`` is executing an ``import`` statement (not a call into a library).

    The interpreter calls ``__import__`` from the ``IMPORT_NAME`` instruction of
    the frame whose code says ``import``; a C function that imports (through
    ``PyImport_Import``) runs while its caller's frame is on a call instruction.
    """
    code = frame.f_code.co_code
    offset = frame.f_lasti
    return 0 <= offset < len(code) and code[offset] == _IMPORT_NAME


def preload_lazy_submodules(policy: SandboxPolicy) -> list[str]:
    """Import `LAZY_SUBMODULES` of the allowed packages now; the names that loaded."""
    import importlib

    loaded = []
    for name in LAZY_SUBMODULES:
        if name.split(".")[0] not in policy.roots:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # an optional package not installed: first use will say so
            continue
        loaded.append(name)
    return loaded


def install_builtins(namespace: dict[str, Any], builtins_dict: dict[str, Any]) -> None:
    """Make code run in ``namespace`` (as globals) see ``builtins_dict``.

    ``exec`` and function objects take their builtins from the ``__builtins__``
    key of their globals, so setting it is what scopes the guard to user code:
    the libraries it calls keep their own.
    """
    namespace["__builtins__"] = builtins_dict

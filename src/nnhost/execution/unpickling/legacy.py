"""What the restricted unpickler needs beyond the 0.8 format, for payloads of nnsight 0.6 and 0.7.

Why it exists: a 0.6 or 0.7 client pickles a whole ``RequestModel``: the
tracer, the block compiled into a function shipped as source
(``serialization.make_function``, filled by ``_source_function_setstate``),
the traced frame as ``make_frame`` and, by value, its own model wrapper with
the model's configuration (a transformers config class, made and filled as
data) and the name of its auto class. `RestrictedUnpickler` (`unpickler`)
reads such a payload with the same rules as any other and asks this module
for the parts only this format has: checked versions of those
reconstructors, the few transformers classes a wrapper names, and the shape
of the finished request.

It must never hand a payload nnsight's own ``make_function`` (it compiles
with the server's builtins and runs the source's decorators), and it must
never allow a class to be made that runs library code when built.
"""

from __future__ import annotations
import __future__

import ast
import functools
import importlib
import linecache
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..python_layer.sandbox import SandboxViolation, attribute_problem, check_source, install_builtins
from .allowlist import refuse

if TYPE_CHECKING:
    from .state import Load

SERIALIZATION = "nnsight.intervention.serialization"
#: A function's globals that only say where it came from (what 0.7 ships in ``base_globals``).
_ORIGIN_NAMES = ("__package__", "__name__", "__file__")
_FACTORY = "__nnhost_factory__"


def legacy_reconstructors(me: Load) -> dict[tuple[str, str], Callable[..., Any]]:
    """``(module, name)`` to the checked reconstructor a 0.6/0.7 payload gets, for ``me``'s load."""
    from nnsight.intervention import serialization  # type: ignore[import-untyped]

    policy, user_builtins = me.policy, me.builtins_dict
    #: Each compiled function's closure names, in the client's order (its deferred cells name them so).
    closure_names_of: dict[int, list[str]] = {}
    #: Functions made from nnsight's own source: their globals are the library's, never filled.
    library_functions: dict[int, Any] = {}

    def make_function(
        source: Any, name: Any, filename: Any, qualname: Any, module: Any, doc: Any,
        annotations: Any, defaults: Any, kwdefaults: Any, base_globals: Any,
        closure_values: Any, closure_names: Any, firstlineno: Any = 1,
    ) -> Any:
        if not (isinstance(source, str) and isinstance(name, str) and isinstance(qualname, str)):
            raise refuse("a malformed function")
        if not (filename is None or isinstance(filename, str)) or not isinstance(base_globals, dict):
            raise refuse("a malformed function")
        if not isinstance(firstlineno, int) or not 0 < firstlineno < 10_000_000:
            raise refuse("a malformed function")
        names = list(closure_names or ())
        values = list(closure_values or ())
        if len(names) != len(values) or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise refuse("a malformed function")
        where = f"[{name}:{firstlineno}] {filename or '<serialization>'}"
        source = textwrap.dedent(source)
        library = library_module(filename, source, firstlineno)
        namespace: dict[str, Any]
        if library is not None:
            # nnsight's own code, sent back (a property its envoy made for a module):
            # it runs as the library's, in the library's module.
            namespace = vars(library)
        else:
            try:
                check_source(source, where, policy, me.syntax_note)
            except SandboxViolation as error:
                return me.defer(str(error))
            namespace = {
                key: base_globals[key] for key in _ORIGIN_NAMES if isinstance(base_globals.get(key), str)
            }
            install_builtins(namespace, user_builtins)
        code = function_code(source, name, tuple(names), filename or "<serialization>")
        by_name = dict(zip(names, values))
        cells = tuple(types.CellType(by_name[free]) for free in code.co_freevars)
        code = code.replace(co_firstlineno=firstlineno)
        function = types.FunctionType(code, namespace, name, None, cells or None)
        if defaults:
            function.__defaults__ = tuple(defaults)
        if kwdefaults:
            function.__kwdefaults__ = dict(kwdefaults)
        if annotations:
            function.__annotations__ = dict(annotations)
        function.__qualname__ = qualname
        function.__module__ = module if isinstance(module, str) else "__main__"
        function.__doc__ = doc if isinstance(doc, str) else None
        # Some of nnsight (`Tracer.__getstate__`, its ``info.source``) reads it back.
        function.__source__ = source  # type: ignore[attr-defined]
        register_source(filename, source, firstlineno)
        me.functions[id(function)] = function
        closure_names_of[id(function)] = names
        if library is not None:
            library_functions[id(function)] = function
        return function

    def function_setstate(function: Any, state: Any) -> Any:
        from .shipped_classes import Unavailable

        if isinstance(function, Unavailable):
            return function
        if id(function) not in me.functions:
            raise refuse("globals for a function the request did not ship")
        if not (isinstance(state, tuple) and len(state) == 2
                and isinstance(state[0], dict) and isinstance(state[1], dict)):
            raise refuse("a malformed function")
        attributes, slots = state
        if not all(isinstance(key, str) for key in attributes):
            raise refuse("a malformed function")
        function.__dict__.update({k: v for k, v in attributes.items() if k != "__source__"})
        namespace = slots.get("__globals__", {})
        if not isinstance(namespace, dict) or not all(isinstance(key, str) for key in namespace):
            raise refuse("a malformed function")
        if id(function) not in library_functions:
            function.__globals__.update({k: v for k, v in namespace.items() if k != "__builtins__"})
        deferred = slots.get("__deferred_closure__", {})
        if not isinstance(deferred, dict):
            raise refuse("a malformed function")
        # The client numbers a deferred cell by its function's closure; ours,
        # compiled here, may order (or drop unused) free variables otherwise.
        names = closure_names_of.get(id(function), [])
        cells = dict(zip(function.__code__.co_freevars, function.__closure__ or ()))
        for index, target in deferred.items():
            index = int(index) if isinstance(index, str) and index.isdigit() else index
            if not isinstance(index, int) or not 0 <= index < len(names):
                raise refuse("a malformed function", "a deferred closure cell it does not have")
            if names[index] in cells:
                cells[names[index]].cell_contents = target
        return function

    def make_frame(filename: Any, firstlineno: Any, name: Any) -> Any:
        if not (isinstance(filename, str) and isinstance(firstlineno, int) and isinstance(name, str)):
            raise refuse("a malformed frame")
        return serialization.make_frame(filename, firstlineno, name)

    return {
        (SERIALIZATION, "make_function"): make_function,
        (SERIALIZATION, "_source_function_setstate"): function_setstate,
        (SERIALIZATION, "make_frame"): make_frame,
    }


@functools.lru_cache(maxsize=128)
def function_code(source: str, name: str, closure_names: tuple[str, ...], filename: str) -> types.CodeType:
    """The code of the function ``source`` defines, compiled here and never run.

    The source is compiled inside a factory whose parameters are the
    closure's names, so that they become the function's free variables; the
    function's code is taken out of the factory's constants, so that no line
    of the source (a decorator, a default) runs while the request is read.
    A code object is immutable, so a user's next request with the same
    function takes the one compiled for the last.
    """
    parsed = ast.parse(source)
    if name == "<lambda>":
        if not (len(parsed.body) == 1 and isinstance(parsed.body[0], ast.Expr)
                and isinstance(parsed.body[0].value, ast.Lambda)):
            raise refuse("a function whose source is not one lambda")
        body = f"    ({source.strip()})\n"
    else:
        if not (len(parsed.body) == 1 and isinstance(parsed.body[0], (ast.FunctionDef, ast.AsyncFunctionDef))
                and parsed.body[0].name == name):
            raise refuse(f"a function {name!r} whose source is not one definition of it")
        body = textwrap.indent(source, "    ")
        if not body.endswith("\n"):
            body += "\n"
    factory_source = f"def {_FACTORY}({', '.join(closure_names)}):\n{body}"
    flags = __future__.annotations.compiler_flag
    try:
        module = compile(factory_source, filename, "exec", flags=flags, dont_inherit=True)
    except SyntaxError as error:
        raise refuse(f"the function {name!r}", f"its source does not compile here ({error.msg})") from None
    factory = next(c for c in module.co_consts if isinstance(c, types.CodeType) and c.co_name == _FACTORY)
    for constant in factory.co_consts:
        if isinstance(constant, types.CodeType) and constant.co_name == name:
            return constant
    raise refuse(f"the function {name!r}", "its source does not define it")


def library_module(filename: Any, source: str, firstlineno: int) -> Optional[types.ModuleType]:
    """The module of this process's nnsight whose file holds ``source`` at its line, or None.

    A 0.6 or 0.7 client ships some of nnsight's own functions by source (the
    ones nnsight makes at run time, such as an envoy's properties). The
    runtime runs the same nnsight version, so such a function is recognised
    by its text: the same lines at the same place in the same file of this
    process's nnsight. Anything else is the user's, held to the sandbox's rules.
    """
    if not isinstance(filename, str) or "/nnsight/" not in filename:
        return None
    relative = filename.rsplit("/nnsight/", 1)[1]
    parts = relative.split("/")
    if not relative.endswith(".py") or not all(part.isidentifier() for part in parts[:-1] + [parts[-1][:-3]]):
        return None
    import nnsight  # type: ignore[import-untyped]

    lines = _library_lines(str(Path(nnsight.__file__).parent.joinpath(*parts)))
    if lines is None:
        return None
    wanted = source.strip()
    if wanted.startswith("(lambda") and wanted.endswith(")") and "\n" in wanted:
        wanted = wanted[1:-1]  # how nnsight wraps a lambda of several lines
    held = "".join(lines[firstlineno - 1:firstlineno - 1 + len(wanted.splitlines())])
    if not wanted or not (textwrap.dedent(held).strip() == wanted
                          or (wanted.startswith("lambda") and wanted in held)):
        return None
    name = "nnsight." + ".".join(parts)[:-3].removesuffix(".__init__")
    return importlib.import_module(name)


@functools.lru_cache(maxsize=64)
def _library_lines(path: str) -> Optional[tuple[str, ...]]:
    """The lines of a file of this process's nnsight (which does not change while it runs)."""
    try:
        return tuple(Path(path).read_text().splitlines(keepends=True))
    except OSError:
        return None


def register_source(filename: Any, source: str, firstlineno: int) -> None:
    """Put the shipped source where tracebacks look for it, at its own lines.

    Always the shipped text, even where a file of that name exists on the
    server: the lines a user sees are theirs. The runner clears ``linecache``
    after every job (`runner.forget_sources`).
    """
    if not isinstance(filename, str) or not filename:
        return
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    entry: Any = linecache.cache.get(filename)
    existing = list(entry[2]) if entry is not None and entry[1] is None else []
    end = firstlineno - 1 + len(lines)
    existing.extend(["\n"] * (end - len(existing)))
    existing[firstlineno - 1:end] = lines
    linecache.cache[filename] = (sum(map(len, existing)), None, existing, filename)


def library_class(module: str, name: str) -> Any:
    """A transformers or diffusers class a 0.6/0.7 model wrapper names, or a refusal.

    The wrapper carries its configuration (made and filled as data) and the
    class it loads with (an auto class, a pipeline class: named, never
    called). Only modules the server has already imported (the model's own)
    are looked in.
    """
    qualified = f"{module}.{name}"
    loaded = sys.modules.get(module)
    if loaded is None or not module.startswith(("transformers.", "diffusers.")):
        raise refuse(qualified, "of transformers, a request may name only its model's configuration")
    value: Any = loaded
    for part in name.split("."):
        problem = attribute_problem(part) or ("private names are not accepted" if part.startswith("_") else None)
        if problem:
            raise refuse(qualified, problem)
        value = getattr(value, part, None)
    if is_config_class(value) or is_auto_class(value):
        return value
    raise refuse(qualified, "of transformers, a request may name only its model's configuration")


def is_config_class(value: Any) -> bool:
    """A class whose instances are data: a model's configuration, made and filled by the payload."""
    if not isinstance(value, type):
        return False
    from transformers import GenerationConfig, PretrainedConfig

    return issubclass(value, (PretrainedConfig, GenerationConfig))


def is_auto_class(value: Any) -> bool:
    """A class a wrapper loads its model with: an auto class, or a diffusers pipeline."""
    if not isinstance(value, type):
        return False
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    if issubclass(value, _BaseAutoModelClass):
        return True
    pipelines = sys.modules.get("diffusers.pipelines.pipeline_utils")
    return pipelines is not None and issubclass(value, pipelines.DiffusionPipeline)


def check_request(me: Load, result: Any) -> Any:
    """The finished load is a 0.6/0.7 request whose every function this load compiled."""
    from nnsight.intervention.serialization import SerializedFrame  # type: ignore[import-untyped]
    from nnsight.intervention.tracing.base import Tracer  # type: ignore[import-untyped]
    from nnsight.schema.request import RequestModel  # type: ignore[import-untyped]

    tracer = getattr(result, "tracer", None)
    info = getattr(tracer, "info", None)
    if not (isinstance(result, RequestModel) and isinstance(tracer, Tracer)
            and isinstance(getattr(info, "frame", None), SerializedFrame)):
        raise refuse("something that is not an nnsight request")
    shipped = [result.interventions] + [
        getattr(mediator, "intervention", None) for mediator in getattr(tracer, "mediators", None) or ()
    ]
    for function in shipped:
        if not (isinstance(function, types.FunctionType) and (
            not me.policy.enabled or function.__globals__.get("__builtins__") is me.builtins_dict
        )):
            raise refuse("a request whose code is not a function it shipped as source")
    # The name of the model's method the trace runs (``__call__``, ``__nnsight_generate__``,
    # or a method a user traced): the server calls it by name, so it is held to the
    # rules of an attribute a user's code names.
    fn = getattr(tracer, "fn", None)
    if fn is not None and not (isinstance(fn, str) and (
        fn == "__call__" or re.fullmatch(r"__nnsight_[a-z_]+__", fn)
        or (not fn.startswith("_") and attribute_problem(fn) is None)
    )):
        raise refuse(f"a trace of the model's method {fn!r}", "a trace may run the model's public methods")
    return result

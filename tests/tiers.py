"""Test tiers: the markers `unit`, `e2e`, `services`, `browser` and `security`.

tests/conftest.py gives every test one or more of these (registered in
pyproject.toml), found from the code it runs, never tagged by hand: the test
function, each fixture in its closure, and, through them, every function and
class of tests/ that they name, import or reach through a tests/ module (a
helper that builds a `ServerProcess` makes its callers e2e). `unit` is what is
left: no server, no service, no browser; `make check` runs those. A new way to
start something belongs in `STARTERS`; tests/test_markers.py checks the rules.
"""

from __future__ import annotations

import dis
import importlib
import inspect
import sys
import types
from pathlib import Path
from typing import Optional

import pytest

TIERS = ("unit", "e2e", "services", "browser", "security")
_TESTS = Path(__file__).resolve().parent

#: Names whose use starts something. e2e: nnhost end to end, in a process or build of its
#: own (a child Python of any kind counts too, see `_child_python`); services: a server of
#: the suite's own on loopback; browser: chromium.
STARTERS = {
    "e2e": frozenset({
        "ServerProcess",  # `nnhost serve` in a child process (nnhost.testing)
        "uvicorn",  # an nnhost app on a socket, in a thread
        "gpu_memory",  # nnhost's device probe: a child Python that imports torch
        "build_demo_model",  # trains the demo model, as `nnhost serve --demo` does
    }),
    "services": frozenset({
        "Postgres", "RedisProcess", "RayCluster", "NginxProcess", "nginx_in_front_of",
        "S3Endpoint", "ThreadedMotoServer",
    }),
    "browser": frozenset({"sync_playwright"}),
}

#: Fixtures that ask for another fixture (`request.getfixturevalue`) for one of their
#: parameters only, which the fixture closure cannot show: {fixture: {param: fixture}}.
#: A fixture that calls getfixturevalue and is not listed is taken to use every fixture
#: its code names in a string.
BY_PARAM = {
    "database_url": {"postgresql": "postgres"},
    "store": {"s3": "s3"},
}


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


_OURS: dict = {}


def _ours(thing) -> bool:
    """Whether `thing` is a function or class defined in a file of tests/."""
    if thing not in _OURS:
        try:
            _OURS[thing] = Path(inspect.getfile(thing)).resolve().is_relative_to(_TESTS)
        except (TypeError, OSError):
            _OURS[thing] = False
    return _OURS[thing]


def _child_python(code: types.CodeType) -> bool:
    """Whether `code` starts a child Python (``subprocess.run([sys.executable, ...])``).

    That is nnhost's command line, a benchmark script or a probe: seconds of imports at least,
    and often a real server (``nnhost.cli serve``), so such a test is never `unit`.
    """
    return "executable" in code.co_names and bool(
        {"run", "Popen", "check_output", "check_call", "call"} & set(code.co_names)
    )


_STARTS: dict = {}
_DIRECT: dict = {}


def starts(thing) -> tuple[set[str], set[str]]:
    """What the code of a function or class of tests/ starts, helpers it names included.

    Returns the tiers found and the fixtures it asks for by name (`request.getfixturevalue`).
    """
    if thing not in _STARTS:
        tiers: set[str] = set()
        asked: set[str] = set()
        seen = {thing}
        pending = [thing]
        while pending:
            found, wants, helpers = _direct(pending.pop())
            tiers |= found
            asked |= wants
            pending.extend(helper for helper in helpers if helper not in seen)
            seen.update(helpers)
        _STARTS[thing] = tiers, asked
    return _STARTS[thing]


def _direct(thing) -> tuple[set[str], set[str], list]:
    """What `thing`'s own code starts, the fixtures it asks for, and the helpers it names."""
    if thing in _DIRECT:
        return _DIRECT[thing]
    tiers: set[str] = set()
    asked: set[str] = set()
    helpers: list = []
    unwrapped = inspect.unwrap(getattr(thing, "__func__", thing))
    if isinstance(unwrapped, type):
        for base in unwrapped.__mro__:
            tiers |= {tier for tier, names in STARTERS.items() if base.__name__ in names}
        for member in vars(unwrapped).values():
            member = member.fget if isinstance(member, property) else member
            member = getattr(member, "__func__", member)
            if inspect.isfunction(member):
                helpers.append(member)
    elif getattr(unwrapped, "__code__", None) is not None:
        namespace = getattr(unwrapped, "__globals__", {})
        for part in _codes(unwrapped.__code__):
            if _child_python(part):
                tiers.add("e2e")
            if "getfixturevalue" in part.co_names:
                asked |= {const for const in part.co_consts if isinstance(const, str)}
            for name in part.co_names:
                tiers |= {tier for tier, names in STARTERS.items() if name in names}
            helpers.extend(_named(part, namespace))
    _DIRECT[thing] = tiers, asked, helpers
    return _DIRECT[thing]


def _named(code: types.CodeType, namespace: dict) -> list:
    """The functions and classes of tests/ that `code` names: its module's globals, what it
    imports itself, and attributes of the tests/ modules it names (``programs.run``)."""
    modules = [namespace[name] for name in code.co_names
               if isinstance(namespace.get(name), types.ModuleType) and _ours_module(namespace[name])]
    found = []
    module = None
    imports = dis.opmap["IMPORT_NAME"] in code.co_code[::2]  # opcodes are every other byte
    for instruction in dis.get_instructions(code) if imports else ():
        if instruction.opname == "IMPORT_NAME":
            module = _imported(instruction.argval, namespace)
            if module is not None:
                modules.append(module)
        elif instruction.opname == "IMPORT_FROM" and module is not None:
            found.append(getattr(module, instruction.argval, None))
    for name in code.co_names:
        found.append(namespace.get(name))
        found.extend(getattr(module, name, None) for module in modules)
    return [helper for helper in found
            if (inspect.isfunction(helper) or isinstance(helper, type)) and _ours(helper)]


def _ours_module(module: types.ModuleType) -> bool:
    path = getattr(module, "__file__", None)
    return bool(path) and Path(path).resolve().is_relative_to(_TESTS)


def _imported(name: str, namespace: dict) -> Optional[types.ModuleType]:
    """The module of tests/ an import statement in `namespace`'s module names, if it is one."""
    package = namespace.get("__package__") or ""
    for candidate in dict.fromkeys([f"{package}.{name}" if package else name, name]):
        module = sys.modules.get(candidate)
        if module is None:
            folder = _TESTS / "/".join(candidate.split(".")[:-1]) if "." in candidate else _TESTS
            if not (folder / f"{candidate.rsplit('.', 1)[-1]}.py").is_file():
                continue
            module = importlib.import_module(candidate)
        return module if _ours_module(module) else None
    return None


def _fixture_tiers(item: pytest.Item, name: str, done: set[str]) -> set[str]:
    """Tiers of fixture `name` as `item` uses it, with those of the fixtures it asks for by name.

    The fixtures it requests as arguments are in the item's closure and are walked by the caller.
    """
    if name in done:
        return set()
    done.add(name)
    tiers: set[str] = set()
    for definition in item.session._fixturemanager.getfixturedefs(name, item) or ():
        if not _ours(definition.func):
            continue
        found, asked = starts(definition.func)
        tiers |= found
        if asked and name in BY_PARAM:
            param = getattr(getattr(item, "callspec", None), "params", {}).get(name)
            asked = {BY_PARAM[name][param]} if param in BY_PARAM[name] else set()
        tiers |= _asked_tiers(item, asked, done)
    return tiers


def _asked_tiers(item: pytest.Item, asked: set[str], done: set[str]) -> set[str]:
    """Tiers of fixtures asked for by name, and of everything these request in turn."""
    tiers: set[str] = set()
    for name in asked:
        definitions = item.session._fixturemanager.getfixturedefs(name, item) or ()
        if definitions:
            tiers |= _fixture_tiers(item, name, done)
        for definition in definitions:
            tiers |= _asked_tiers(item, set(definition.argnames) - done, done)
    return tiers


def tiers_of(item: pytest.Item) -> set[str]:
    """The tiers of one collected test: never empty, and `unit` only when it is the only one."""
    marked = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    tiers = marked - {"unit"}
    if Path(str(item.path)).resolve().is_relative_to(_TESTS / "security"):
        tiers.add("security")
    done: set[str] = set()
    function = getattr(item, "function", None)
    if function is not None:
        found, asked = starts(function)
        tiers |= found | _asked_tiers(item, asked, done)
        if getattr(item, "cls", None) is not None:
            tiers |= starts(item.cls)[0]
    for name in getattr(item, "fixturenames", ()):
        tiers |= _fixture_tiers(item, name, done)
    if "unit" in marked and tiers:
        raise pytest.UsageError(f"{item.nodeid} is marked unit but is {', '.join(sorted(tiers))}")
    return tiers or {"unit"}


#: The tiers of every test collected in this session, by node id (before ``-m`` deselects).
COLLECTED_TIERS = pytest.StashKey[dict]()

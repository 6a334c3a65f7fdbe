"""The package's imports form no circle, and execution/'s rooms import only inward.

Every ``import`` counts, wherever it is written: at the top, inside a
function (a lazy import) or under ``if TYPE_CHECKING`` (a type-only one). A
circle of those is a pair of modules that cannot be read, changed or tested
one without the other; a type one module needs from the module that imports
it belongs in a third, smaller one.

execution/ is split by the process that runs the code and by the layer it
is; each sub-package's docstring says what it may import, and `INWARD`
holds the same list, checked here against the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nnhost

PACKAGE = Path(nnhost.__file__).resolve().parent
EXECUTION = "nnhost.execution"

#: What each part of execution/ may import of execution/ ("." is the shared
#: vocabulary at its top: messages, events, channel, policy, handoff, nnsight_api).
INWARD = {
    "os_layer": set(),
    "python_layer": set(),
    "weights": set(),
    ".": {"os_layer", "python_layer"},
    "unpickling": {".", "python_layer"},
    "guard": {".", "weights", "python_layer"},
    "job": {".", "guard", "os_layer", "python_layer", "unpickling", "weights"},
    "host": {".", "guard", "job", "os_layer", "python_layer", "unpickling", "weights"},
}


#: The service's side, which the worker side never imports.
SERVICE_SIDE = {"api", "app", "auth", "cli", "controller", "db", "front", "jobs", "replicas", "storage",
                "telemetry", "web"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every nnhost module ``name`` imports, anywhere in its text."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("nnhost") and target not in (name, "nnhost"):
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def room(module: str) -> str:
    rest = module[len(EXECUTION) + 1:].split(".")
    return rest[0] if len(rest) > 1 else "."


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_package_imports_itself_back():
    found = circles(graph())
    assert not found, "import circles (counting lazy and type-only imports):\n" + "\n".join(
        " -> ".join(part) for part in found)


def test_executions_rooms_import_only_inward():
    edges = graph()
    rooms = {room(name) for name in edges if name.startswith(EXECUTION + ".")}
    assert rooms == set(INWARD), "a room of execution/ without its line in INWARD (or a line too many)"
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in edges.items() if name.startswith(EXECUTION + ".")
        for target in targets if target.startswith(EXECUTION + ".")
        and room(target) != room(name) and room(target) not in INWARD[room(name)]
    )
    assert not wrong, "imports against execution/'s arrows:\n" + "\n".join(wrong)
    outside = sorted(f"{name} imports {target}" for name, targets in edges.items()
                     if name.startswith(EXECUTION) for target in targets
                     if target.split(".")[1] in SERVICE_SIDE)
    assert not outside, "execution/ knows nothing of the API, the controller or the database:\n" + "\n".join(
        outside)


def test_each_room_says_what_runs_there_and_what_it_may_import():
    for name in INWARD:
        if name == ".":
            continue
        init = PACKAGE / "execution" / name / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import" in doc, f"execution/{name}/__init__.py does not say what it may import"
        allowed = INWARD[name]
        named = {part for part in allowed if part != "."}
        assert all(f"`{part}`" in doc for part in named), (name, named, doc)


def test_each_package_says_what_it_may_import_and_imports_nothing_else():
    """Each folder of the package names, in its docstring, the parts of nnhost it may
    import (in backticks); what its modules import is checked against that list."""
    edges = graph()
    packages = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
    wrong = []
    for package in packages:
        doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert "May import:" in doc, f"{package}/__init__.py does not say what it may import"
        allowed = doc.split("May import:", 1)[1]
        for name, targets in edges.items():
            if not name.startswith(f"nnhost.{package}.") and name != f"nnhost.{package}":
                continue
            for target in targets:
                part = target.split(".")[1] if target.count(".") else target
                if part != package and f"`{part}" not in allowed:
                    wrong.append(f"{name} imports {target}, which {package}/'s docstring does not allow")
    assert not wrong, "\n".join(sorted(wrong))

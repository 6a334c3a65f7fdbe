"""The settings as Markdown tables, rendered from their own declarations: ``nnhost settings``.

Every setting is declared once, in `nnhost.config.Settings` (its type, default,
description, and whether ``nnhost serve`` takes it as a flag); so is every key
of a ``[[model]]`` table (`nnhost.config.ModelEntry`) and of an ``[[allow]]``
table (`nnhost.config.AllowEntry`). This module renders each of them as one
Markdown table: the key, its flag and environment variable (settings only),
the kind of value it takes, its default and what it does. Nothing here knows
one setting from another.

docs/configuration.md holds the tables between HTML comment markers, e.g.
``<!-- settings-table:start -->`` and ``<!-- settings-table:end -->``;
``nnhost settings --write docs/configuration.md`` (what ``make docs`` runs)
puts the current render there, and ``--check`` says whether it is there.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ..config import AllowEntry, ModelEntry, Settings, flag_of, shown_of
from ..units import format_duration, format_size, parse_duration, parse_size
from .flags import option, parsers, without_none

#: Each table docs/configuration.md holds: its marker name and the declarations it renders.
TABLES: dict[str, type[BaseModel]] = {
    "settings-table": Settings,
    "model-table": ModelEntry,
    "allow-table": AllowEntry,
}

#: The command that brings docs/configuration.md's tables up to date.
REGENERATE = "make docs"


def _code(text: str) -> str:
    return f"`{text}`"


def _bounds(field: FieldInfo) -> str:
    """``, 1 to 65535``, ``, 0 or more``, ``, more than 0``: the bounds a number is declared with."""
    found = {name: getattr(item, name) for item in field.metadata for name in ("ge", "gt", "le")
             if getattr(item, name, None) is not None}
    if "ge" in found and "le" in found:
        return f", {found['ge']} to {found['le']}"
    words = []
    if "ge" in found:
        words.append(f"{found['ge']} or more")
    if "gt" in found:
        words.append(f"more than {found['gt']}")
    if "le" in found:
        words.append(f"at most {found['le']}")
    return "".join(f", {word}" for word in words)


def value_kind(field: FieldInfo) -> str:
    """What a field takes, in words: a size, a duration, one of some choices, a list..."""
    declared = parsers(field)
    kind = without_none(field.annotation)
    if parse_size in declared:
        return "size"
    if parse_duration in declared:
        return "duration"
    if kind is bool:
        return "boolean"
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(_code(str(choice)) for choice in get_args(kind))
    if kind is int:
        return "whole number" + _bounds(field)
    if kind is float:
        return "number" + _bounds(field)
    if kind is Path:
        return "path"
    origin = get_origin(kind)
    if origin is list:
        (item,) = get_args(kind) or (Any,)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return "tables (below)"
        return "list"
    if origin is dict:
        _key, item = get_args(kind) or (Any, Any)
        return "table of sizes" if parse_size in parsers(item) else "table"
    if origin is Union:
        return " or ".join(_part_kind(part) for part in get_args(kind) if part is not type(None))
    return "text"


def _part_kind(annotation: Any) -> str:
    """A kind a union allows (``device_map``: text or a table)."""
    return {dict: "table", list: "list"}.get(get_origin(annotation), "text")


def default_text(field: FieldInfo) -> str:
    """The default as the table shows it: a `Shown` where there is one, else the value itself."""
    shown = shown_of(field)
    if shown is not None:
        return shown.default
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True)
    declared = parsers(field)
    if default is None:
        return "none"
    if isinstance(default, bool):
        return _code(str(default).lower())
    if parse_size in declared:
        return _code(format_size(default) if default else "0")
    if parse_duration in declared:
        return _code(format_duration(default) if default else "0")
    if isinstance(default, list):
        return _code(", ".join(str(item) for item in default)) if default else _code("[]")
    if isinstance(default, dict):
        return _code("{}") if not default else _code(str(default))
    if isinstance(default, float) and default.is_integer():
        return _code(str(int(default)))
    return _code(str(default))


def _cell(text: str) -> str:
    """A table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def render(model: type[BaseModel]) -> str:
    """The Markdown table of ``model``'s fields, in their declared order (no trailing newline)."""
    is_settings = issubclass(model, Settings)
    if is_settings:
        prefix = str(Settings.model_config.get("env_prefix", ""))
        head = ["Setting", "Flag", "Environment", "Value", "Default", "Meaning"]
    else:
        head = ["Key", "Value", "Default", "Meaning"]
    rows = [head, ["---"] * len(head)]
    for name, field in model.model_fields.items():
        row = [_code(name)]
        if is_settings:
            flag = flag_of(field)
            row.append(_code(option(name)) if flag is not None else "")
            row.append(_code(prefix + name.upper()))
        row += [value_kind(field), default_text(field), (field.description or "").strip()]
        rows.append([_cell(cell) for cell in row])
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def _region(name: str) -> re.Pattern[str]:
    start, end = markers(name)
    return re.compile(rf"({re.escape(start)}\n)(.*?)(^{re.escape(end)})", re.MULTILINE | re.DOTALL)


def held(text: str, name: str) -> str | None:
    """The table ``text`` holds between ``name``'s markers (None when the markers are missing)."""
    match = _region(name).search(text)
    return match.group(2).strip() if match else None


def update(text: str) -> str:
    """``text`` with every table between its markers replaced by the current render.

    Raises ValueError naming the markers a table lacks.
    """
    for name, model in TABLES.items():
        match = _region(name).search(text)
        if match is None:
            start, end = markers(name)
            raise ValueError(f"no {start} ... {end} in the file")
        text = f"{text[:match.end(1)]}{render(model)}\n{text[match.start(3):]}"
    return text


def register(commands: Any) -> None:
    """``nnhost settings``: print the tables, or bring a file's up to date (``--write``)."""
    parser = commands.add_parser(
        "settings", help="Print every setting as Markdown tables (docs/configuration.md's).",
        description="Print every setting, and the keys of [[model]] and [[allow]] tables, as "
        "Markdown tables rendered from their declarations in nnhost.config.",
    )
    parser.add_argument("--write", metavar="FILE", type=Path,
                        help="replace the tables between FILE's markers instead of printing them")
    parser.add_argument("--check", metavar="FILE", type=Path,
                        help="exit 1 if FILE's tables are not the current render")
    parser.set_defaults(run=settings_command)


def settings_command(args: argparse.Namespace) -> int:
    path: Path | None = args.write or args.check
    if path is None:
        print("\n\n".join(f"{markers(name)[0]}\n{render(model)}\n{markers(name)[1]}"
                          for name, model in TABLES.items()))
        return 0
    text = path.read_text(encoding="utf-8")
    try:
        current = update(text)
    except ValueError as error:
        print(f"nnhost settings: {path}: {error}", file=sys.stderr)
        return 2
    if args.check:
        if current != text:
            print(f"nnhost settings: {path}'s tables differ from the settings; run `{REGENERATE}`",
                  file=sys.stderr)
            return 1
        return 0
    if current != text:
        path.write_text(current, encoding="utf-8")
        print(f"nnhost settings: {path} updated")
    return 0

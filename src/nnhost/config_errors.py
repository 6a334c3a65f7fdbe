"""Why the settings were refused, said so that an operator can fix them.

`config.load_settings` validates; this module only words the problems: an
``NNHOST_`` variable that names no setting, and each pydantic error as one
line naming the key, the value, where it came from (flag, environment,
nnhost.toml, default) and what is accepted. It must never decide what is
valid, and never guess what a bad value meant.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from pydantic_core import ErrorDetails

from .units import DURATION_HELP, SIZE_HELP

ENV_PREFIX = "NNHOST_"
#: ``NNHOST_`` variables that are not settings: the test suite's and the workers' own.
RESERVED_ENV_PREFIXES = ("NNHOST_TEST_", "NNHOST_WORKER_")


def unknown_environment(environ: Mapping[str, str], fields: Iterable[str]) -> list[str]:
    """A line for each ``NNHOST_`` variable that names none of ``fields`` (nor a reserved prefix)."""
    known = {f"{ENV_PREFIX}{name.upper()}" for name in fields}
    problems = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        if name.startswith(RESERVED_ENV_PREFIXES):
            continue
        guess = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {guess[0]}?" if guess else ""
        problems.append(
            f"environment variable {name}={environ[name]!r} is not a setting{hint} "
            f"(NNHOST_ variables name settings: see the table in docs/configuration.md)"
        )
    return problems


class SettingConflict(ValueError):
    """Settings that are each valid but cannot go together (raised by `Settings`' model validator).

    Each problem is its message, and the setting and value it is told against
    (none: the message stands alone).
    """

    def __init__(self) -> None:
        super().__init__("settings that cannot go together")
        self.problems: list[tuple[str, Optional[str], Any]] = []

    def add(self, message: str, key: Optional[str] = None, value: Any = None) -> None:
        self.problems.append((message, key, value))
        self.args = ("; ".join(problem[0] for problem in self.problems),)


class Origins:
    """Where a setting's value came from, for the message."""

    def __init__(
        self,
        flags: Mapping[str, Any],
        environ: Mapping[str, str],
        toml: Mapping[str, Any],
        config_file: Path,
    ) -> None:
        self.flags, self.environ, self.toml, self.config_file = flags, environ, toml, config_file

    def __call__(self, key: str) -> str:
        if key in self.flags:
            return f"--{key.replace('_', '-')}"
        if f"{ENV_PREFIX}{key.upper()}" in self.environ:
            return f"{ENV_PREFIX}{key.upper()}"
        if key in self.toml or key == "catalog":
            return str(self.config_file)
        return "the default"

    def entry(self, key: str, index: int) -> Any:
        """The ``index``-th table of the list setting ``key``, as written (None if unknown)."""
        tables: Any = self.flags.get(key)
        if tables is None:
            tables = self.environ.get(f"{ENV_PREFIX}{key.upper()}")
            if isinstance(tables, str):
                try:
                    tables = json.loads(tables)
                except ValueError:
                    tables = None
        if tables is None:
            tables = self.toml.get(key)
        try:
            return tables[index]
        except (TypeError, IndexError, KeyError):
            return None


ACCEPTED = {
    "bool_parsing": "true or false (also 1/0, yes/no, on/off)",
    "bool_type": "true or false (also 1/0, yes/no, on/off)",
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a table",
}


def _reason(error: ErrorDetails) -> str:
    """What is wrong with the value, and what is accepted instead."""
    value = error.get("input")
    kind = error.get("type", "")
    context = error.get("ctx") or {}
    if kind == "value_error":
        reason = str(context.get("error") or error.get("msg", ""))
        if "size" in reason and SIZE_HELP not in reason:
            reason += f"; use {SIZE_HELP}"
        if "duration" in reason and DURATION_HELP not in reason:
            reason += f"; use {DURATION_HELP}"
        return reason
    if kind == "literal_error":
        return f"not accepted; use one of {context.get('expected')}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound = {"greater_than": "more than", "greater_than_equal": "at least",
                 "less_than": "less than", "less_than_equal": "at most"}[kind]
        limit = next(iter(context.values()), "?")
        return f"out of range; use a value {bound} {limit}"
    if kind == "json_invalid" or isinstance(value, str) and kind.endswith("_type"):
        return f"not accepted: {error.get('msg')}"
    return f"not accepted; use {ACCEPTED.get(kind, error.get('msg', 'another value'))}"


#: The settings that hold TOML tables of their own, as nnhost.toml names them.
TABLES = {"catalog": "[[model]]", "allow": "[[allow]]"}
#: What a missing key's example value looks like, where one helps.
EXAMPLES = {"max_size": '"2GB"'}


def _table_entry(error: ErrorDetails, location: list[str], origin: Origins, keys: Iterable[str]) -> str:
    """One line for an error inside a ``[[model]]`` or ``[[allow]]`` table, naming the table and the key."""
    setting = location[0]
    table_name = TABLES[setting]
    where = f"(in {origin(setting)})"
    kind = error.get("type", "")
    table = origin.entry(setting, int(location[1]))
    name = table.get("repo_id") if isinstance(table, dict) else None
    entry = f"{table_name} {name!r}" if name else f"{table_name} number {int(location[1]) + 1}"
    if len(location) == 2:
        if kind in ("model_type", "model_attributes_type", "dict_type"):
            return f"each {table_name} must be a table with a repo_id {where}"
        return f"{_reason(error)} {where}"  # the reason names the model
    key = ".".join(location[2:])
    if kind == "extra_forbidden":
        known = sorted(keys)
        guess = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {guess[0]!r}?" if guess else ""
        return (
            f"{entry}: unknown key {key!r}{hint} (known: {', '.join(known)}) {where}"
        )
    if kind == "missing":
        if key == "repo_id":
            return f"every {table_name} needs a repo_id {where}"
        example = f", e.g. {EXAMPLES[key]}" if key in EXAMPLES else ""
        return f"{entry} needs a {key}{example} {where}"
    return f"{entry}: {key} = {error.get('input')!r}: {_reason(error)} {where}"


def describe(
    error: ErrorDetails, origin: Origins, fields: Iterable[str], table_keys: Mapping[str, Iterable[str]]
) -> str:
    """One line for one pydantic error: the key, the value, where it came from, what is accepted.

    ``fields`` are the settings' names; ``table_keys`` the keys each table setting
    (`TABLES`: ``catalog`` for ``[[model]]``, ``allow`` for ``[[allow]]``) takes.
    """
    location = [str(part) for part in error.get("loc", ())]
    key = location[0] if location else "?"
    name = ".".join(location) if location else "?"
    value = error.get("input")
    kind = error.get("type", "")
    conflict = (error.get("ctx") or {}).get("error")
    if isinstance(conflict, SettingConflict):
        return "\n".join(
            message if about is None
            else f"setting {about} = {setting!r} (from {origin(about)}): {message}"
            for message, about, setting in conflict.problems
        )
    if kind == "extra_forbidden" and len(location) == 1:
        guess = difflib.get_close_matches(key, list(fields), n=1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        return (
            f"unknown setting {key!r} = {value!r} (in {origin(key)}); {hint}"
            "the settings are listed in docs/configuration.md"
        )
    if key in TABLES and len(location) >= 2:
        return _table_entry(error, location, origin, table_keys.get(key, ()))
    accepted = _reason(error)
    if key in ("catalog", "limits"):
        # The reason already names the table ([limits.tag]).
        return f"{accepted} (in {origin(key)})"
    return f"setting {name} = {value!r} (from {origin(key)}): {accepted}"

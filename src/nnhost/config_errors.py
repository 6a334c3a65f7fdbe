"""Why the settings were refused, said so that an operator can fix them.

`config.load_settings` validates; this module only words the problems: an
``NNHOST_`` variable that names no setting, and each pydantic error as one
line naming the key, the value, where it came from (flag, environment,
nnhost.toml, default) and what is accepted. It must never decide what is
valid, and never guess what a bad value meant.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Mapping

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
            f"(NNHOST_ variables name settings: see the table in README's Configuration)"
        )
    return problems


class Origins:
    """Where a setting's value came from, for the message."""

    def __init__(self, flags, environ, toml, config_file) -> None:
        self.flags, self.environ, self.toml, self.config_file = flags, environ, toml, config_file

    def __call__(self, key: str) -> str:
        if key in self.flags:
            return f"--{key.replace('_', '-')}"
        if f"{ENV_PREFIX}{key.upper()}" in self.environ:
            return f"{ENV_PREFIX}{key.upper()}"
        if key in self.toml or key == "catalog":
            return str(self.config_file)
        return "the default"


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


def describe(error: dict, origin: Origins, fields: Iterable[str]) -> str:
    """One line for one pydantic error: the key, the value, where it came from, what is accepted."""
    location = [str(part) for part in error.get("loc", ())]
    key = location[0] if location else "?"
    name = ".".join(location) if location else "?"
    value = error.get("input")
    kind = error.get("type", "")
    context = error.get("ctx") or {}
    if kind == "extra_forbidden":
        guess = difflib.get_close_matches(key, list(fields), n=1)
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        return (
            f"unknown setting {key!r} = {value!r} (in {origin(key)}); {hint}"
            "the settings are listed in README's Configuration table"
        )
    if kind == "value_error":
        reason = str(context.get("error") or error.get("msg", ""))
        if "size" in reason and SIZE_HELP not in reason:
            reason += f"; use {SIZE_HELP}"
        if "duration" in reason and DURATION_HELP not in reason:
            reason += f"; use {DURATION_HELP}"
        accepted = reason
    elif kind == "literal_error":
        accepted = f"not accepted; use one of {context.get('expected')}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound = {"greater_than": "more than", "greater_than_equal": "at least",
                 "less_than": "less than", "less_than_equal": "at most"}[kind]
        limit = next(iter(context.values()), "?")
        accepted = f"out of range; use a value {bound} {limit}"
    elif kind == "json_invalid" or isinstance(value, str) and kind.endswith("_type"):
        accepted = f"not accepted: {error.get('msg')}"
    else:
        accepted = f"not accepted; use {ACCEPTED.get(kind, error.get('msg', 'another value'))}"
    if key in ("catalog", "limits"):
        # The reason already names the table ([[model]] 'org/x', [limits.tag]).
        return f"{accepted} (in {origin(key)})"
    return f"setting {name} = {value!r} (from {origin(key)}): {accepted}"

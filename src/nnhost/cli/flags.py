"""The flags of ``nnhost serve`` that are settings, generated from `nnhost.config.Settings`.

A `Settings` field that carries `nnhost.config.Flag` becomes ``--NAME-WITH-DASHES``:
its help is the field's description (with its default), a boolean is a
switch (given: true), a `Literal` offers its values as choices, a table
(``dict``) is a repeatable ``KEY=VALUE``, a plain whole number is checked as
one by argparse, and anything else reaches the setting as written, to be
parsed and checked there (sizes, durations, URLs). A flag not given is None, so
the environment and nnhost.toml decide (`nnhost.config.load_settings`).

Nothing here knows one setting from another: a new setting with a `Flag` is
on the command line, in ``--help`` and read back (`given`) with no change here.
"""

from __future__ import annotations

import argparse
from typing import Any, Collection, Iterator, Literal, Optional, Union, get_args, get_origin

from pydantic import BeforeValidator
from pydantic.fields import FieldInfo

from ..config import Flag, Settings, flag_of, shown_of
from ..units import format_duration, format_size, parse_duration, parse_size


def setting_flags(only: Optional[Collection[str]] = None) -> Iterator[tuple[str, FieldInfo, Flag]]:
    """Each setting that is a flag (or those of ``only``): its name, field and `Flag`, in order."""
    for name, field in Settings.model_fields.items():
        flag = flag_of(field)
        if flag is not None and (only is None or name in only):
            yield name, field, flag


def option(name: str) -> str:
    """The flag of the setting ``name``: ``data_dir`` is ``--data-dir``."""
    return "--" + name.replace("_", "-")


def parsers(declared: FieldInfo | Any) -> list[Any]:
    """The parsers a declaration runs on its raw value (`units.parse_size`, ...): a field's,
    or an ``Annotated`` type's (a dict's item type)."""
    metadata = declared.metadata if isinstance(declared, FieldInfo) else getattr(declared, "__metadata__", ())
    return [item.func for item in metadata if isinstance(item, BeforeValidator)]


def without_none(annotation: Any) -> Any:
    """``Optional[X]`` as ``X``."""
    if get_origin(annotation) is Union:
        kinds = [kind for kind in get_args(annotation) if kind is not type(None)]
        if len(kinds) == 1:
            return kinds[0]
    return annotation


def _shown_default(field: FieldInfo) -> str:
    """The default as ``--help`` shows it; "" when there is none worth showing."""
    shown = shown_of(field)
    if shown is not None:
        return shown.default.replace("`", "")
    default = field.get_default(call_default_factory=True)
    if default is None or default is False or default == [] or default == {}:
        return ""
    if parse_size in parsers(field):
        return format_size(default)
    if parse_duration in parsers(field):
        return format_duration(default)
    return str(default)


def help_text(field: FieldInfo) -> str:
    """The field's description, with its default when the description does not say it."""
    text = (field.description or "").strip()
    shown = _shown_default(field)
    if shown and "default" not in text.lower():
        text = f"{text.rstrip('.')}. Default: {shown}."
    return text.replace("%", "%%")  # argparse formats help with %


def add_setting_flags(
    parser: argparse.ArgumentParser, only: Optional[Collection[str]] = None
) -> None:
    """Add a flag to ``parser`` for each setting that carries a `Flag` (or each of ``only``)."""
    missing = set(only or ()) - {name for name, _field, _flag in setting_flags()}
    if missing:
        raise ValueError(f"no setting marked Flag() is called {', '.join(sorted(missing))}")
    for name, field, flag in setting_flags(only):
        kind = without_none(field.annotation)
        options: dict[str, Any] = {"dest": name, "default": None, "help": help_text(field)}
        if kind is bool:
            options["action"] = "store_true"
        else:
            if flag.metavar is not None:
                options["metavar"] = flag.metavar
            if get_origin(kind) is Literal:
                options["choices"] = list(get_args(kind))
            elif get_origin(kind) is dict:
                options["action"] = "append"
            elif kind is int and not parsers(field):
                options["type"] = int
        parser.add_argument(option(name), **options)


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags in ``args`` set; None for each flag not given (or not there).

    A repeated table flag (``--memory-budget cpu=8GiB --memory-budget cuda:0=70GB``)
    becomes the ``KEY=VALUE,KEY=VALUE`` text the setting reads from the environment too.
    """
    values: dict[str, Any] = {}
    for name, _field, _flag in setting_flags():
        value = getattr(args, name, None)
        if isinstance(value, list):
            value = ",".join(value) or None
        values[name] = value
    return values

"""Sizes and durations as people write them, read and written in one place.

Every setting, table and page that takes or shows a number of bytes or seconds
goes through these four functions, so ``"2GB"`` means the same thing wherever
it is written. Units mean what their standards say:

- SI: ``kB``/``KB``, ``MB``, ``GB``, ``TB`` are powers of 1000;
- IEC: ``KiB``, ``MiB``, ``GiB``, ``TiB`` are powers of 1024;
- ``B`` (or no unit) is bytes.

A bare ``K``, ``M``, ``G`` or ``T`` is refused: half of the tools that write it
mean 1000 and half mean 1024, and a budget off by 7% is a silent bug. The
refusal says how to write either. Durations are seconds (a number), or a
number with ``ms``, ``s``, ``m``, ``h``, ``d`` or ``w``.

Nothing here knows about settings or HTTP; the callers say which key was bad.
"""

from __future__ import annotations

import math
import re
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e(\d+))?\s*([a-z]*)\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
SIZE_HELP = (
    "a number of bytes, or a number with a unit: kB, MB, GB, TB (powers of 1000) "
    "or KiB, MiB, GiB, TiB (powers of 1024), e.g. 512MB or 1.5GiB"
)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
_DURATION_UNITS = {
    "": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0,
    "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0,
}
DURATION_HELP = "seconds (a number), or a number with s, m, h, d or w, e.g. 90s, 30m, 24h, 30d"


def parse_size(value: Any) -> int:
    """Bytes from ``1048576``, ``"512MB"``, ``"1.5GiB"``; ValueError naming what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; use {SIZE_HELP}")
    number: float
    if isinstance(value, int):
        number, factor = value, 1
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a size; use {SIZE_HELP}")
        number, factor = value, 1
    elif isinstance(value, str):
        match = _SIZE.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a size; use {SIZE_HELP}")
        digits, exponent, unit = match.groups()
        lowered = unit.lower()
        if lowered in ("k", "m", "g", "t"):
            raise ValueError(
                f"{value!r} is ambiguous: write {digits}{unit.upper()}B for powers of 1000 "
                f"or {digits}{unit.upper()}iB for powers of 1024"
            )
        if lowered not in _SIZE_UNITS:
            raise ValueError(f"{value!r} has an unknown unit {unit!r}; use {SIZE_HELP}")
        number = float(digits) * (10 ** int(exponent) if exponent else 1)
        factor = _SIZE_UNITS[lowered]
    else:
        raise ValueError(f"{value!r} is not a size; use {SIZE_HELP}")
    if number < 0:
        raise ValueError(f"{value!r} is negative; a size is 0 or more ({SIZE_HELP})")
    return int(round(number * factor))


def format_size(size: "int | float | None") -> str:
    """``1536`` -> ``"1.5 KiB"``; IEC units, three significant digits, ``"0 B"`` for 0."""
    if size is None:
        return "-"
    amount = float(size)
    sign = "-" if amount < 0 else ""
    amount = abs(amount)
    if amount < 1024:
        return f"{sign}{amount:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        amount /= 1024
        # Move up a unit as soon as the number would print as 1024 or more.
        if amount < 1023.5 or unit == "PiB":
            text = f"{amount:.3g}" if amount < 100 else f"{amount:.0f}"
            return f"{sign}{text} {unit}"
    raise AssertionError("unreachable")


def parse_duration(value: Any) -> float:
    """Seconds from ``90``, ``"90"``, ``"30m"``, ``"24h"``, ``"30d"``; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; use {DURATION_HELP}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match or match.group(2).lower() not in _DURATION_UNITS:
            raise ValueError(f"{value!r} is not a duration; use {DURATION_HELP}")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    else:
        raise ValueError(f"{value!r} is not a duration; use {DURATION_HELP}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{value!r} is not a duration of 0 seconds or more; use {DURATION_HELP}")
    return seconds


def format_duration(seconds: float) -> str:
    """``5400`` -> ``"1.5 h"``: the largest unit that keeps the number at 1 or more."""
    seconds = float(seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if abs(seconds) >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"

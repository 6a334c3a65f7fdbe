"""Turning a job's ``print()`` output into LOG events as it is written.

User code prints through ``sys.stdout``; while a job runs the worker swaps in a
`LineEmitter`, which hands each completed line to a callback right away, so a
user watching a long job sees its prints live rather than all at the end.

A job that prints without end must not flood the client or the server: after
``max_lines`` lines, one notice is sent and the rest is counted, not sent.
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Callable, Iterator

from ..events import LOG_LINE_CHARS


class LineEmitter(io.TextIOBase):
    """A text stream that calls ``on_line(text)`` for every completed line."""

    def __init__(self, on_line: Callable[[str], None], max_lines: int) -> None:
        self._on_line = on_line
        self._max_lines = max_lines
        self._partial = ""
        self.lines = 0
        self.suppressed = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        pending = self._partial + text
        *complete, self._partial = pending.split("\n")
        for line in complete:
            self._emit(line)
        if len(self._partial) > LOG_LINE_CHARS:
            self._emit(self._partial)
            self._partial = ""
        return len(text)

    def flush(self) -> None:
        # A print(..., end="") followed by nothing else still reaches the user
        # when the job ends (see `close_partial`), not on every flush, so that
        # progress-style output is not split into many messages.
        return None

    def close_partial(self) -> None:
        if self._partial:
            self._emit(self._partial)
            self._partial = ""

    def _emit(self, line: str) -> None:
        if self.lines >= self._max_lines:
            self.suppressed += 1
            return
        self.lines += 1
        if len(line) > LOG_LINE_CHARS:
            line = line[:LOG_LINE_CHARS] + f" ... [{len(line) - LOG_LINE_CHARS} characters cut]"
        self._on_line(line)
        if self.lines == self._max_lines:
            self._on_line(
                f"[nnhost] this job reached its limit of {self._max_lines} printed "
                "lines; further output is not sent."
            )


@contextlib.contextmanager
def capture_stdout(on_line: Callable[[str], None], max_lines: int) -> Iterator[LineEmitter]:
    """Route ``sys.stdout`` to ``on_line`` for the duration of the block."""
    emitter = LineEmitter(on_line, max_lines)
    previous = sys.stdout
    sys.stdout = emitter
    try:
        yield emitter
    finally:
        sys.stdout = previous
        emitter.close_partial()

"""Reading what a job's process says, as the untrusted input it is.

A job's process runs a stranger's code, and that code may have got past the
Python layer: every message it sends is checked before anything else in the
server sees it. `execution.messages.FROM_JOB` reads it (one of the two kinds
a job's process may send, with fields of the right types and sizes:
`event_problem`, the intake's check too); `JobWatch` then accepts it only if
it is an event for *the* job handed to that process, in the one allowed
order (RUNNING, then LOG lines, then COMPLETED or ERROR; an ERROR may also
come first, when the request cannot be read), and no more LOG lines than the
job's own capture lets through. COMPLETED must name
the size the result file really has. Anything else is a violation: the replica
kills the process and fails the job with a clear ERROR. Nothing here raises on
bad input.

`LogLines` turns the bytes a job's process writes to its stdout and stderr
(native writes and Python warnings included) into LOG lines, capped per line
and per job.
"""

from __future__ import annotations

import os
from typing import Optional, Union

from ..execution.channel import BadMessage
from ..execution.events import LOG_LINE_CHARS, JobEvent, JobSpec
from ..execution.messages import Event, FromJob


class Violation(str):
    """Why a message was refused (a str, for the job's ERROR description)."""


def refused(error: BadMessage) -> Violation:
    """A message that the channel or `execution.messages` refused, as the violation it is."""
    return Violation(f"it sent {error}")


class JobWatch:
    """The state of one job as its process reports it; `check` accepts or refuses a message."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.running = False
        self.finished = False
        self.log_events = 0

    def check(self, message: FromJob) -> Union[JobEvent, Violation]:
        """``message``, read by `execution.messages.FROM_JOB`, as its job's next event, or why not."""
        if self.finished:
            return Violation("it sent a message after its job had finished")
        if not isinstance(message, Event):
            return Violation(f"it sent an unexpected message ({_short(message.type)})")
        if message.job_id != self.spec.job_id:
            return Violation("it sent an event for another job")
        status = message.status
        description = message.description
        meta = message.meta
        if status == "RUNNING":
            if self.running:
                return Violation("it reported RUNNING twice")
            self.running = True
            return JobEvent(self.spec.job_id, "RUNNING", description, meta=meta)
        if status == "LOG":
            if not self.running:
                return Violation("it sent LOG before RUNNING")
            # The job's own capture stops at max_log_lines and one notice; a
            # process that sends more is flooding, and is stopped here, before
            # its lines cost the controller anything.
            self.log_events += 1
            if self.log_events > self.spec.max_log_lines + 1:
                return Violation(f"it sent more than {self.spec.max_log_lines + 1:,} LOG lines")
            return JobEvent(self.spec.job_id, "LOG", description)
        if status == "ERROR":
            self.finished = True
            return JobEvent(self.spec.job_id, "ERROR", description, meta=meta)
        # COMPLETED, the one status left (`event_problem` refused any other).
        if not self.running:
            return Violation("it reported COMPLETED without RUNNING")
        size = message.result_size
        if size is None:  # `event_problem` refused any other non-size (`messages.Event`)
            return Violation("it reported COMPLETED without a result size")
        if self.spec.max_result_bytes and size > self.spec.max_result_bytes:
            return Violation("it reported a result over this server's limit")
        actual = _size(self.spec.result_path)
        if actual is not None and actual != size:
            return Violation(
                f"it reported a result of {size} bytes but wrote {actual}"
            )
        self.finished = True
        return JobEvent(self.spec.job_id, "COMPLETED", description, meta=meta, result_size=size)


def _size(path: str) -> Optional[int]:
    if not path:
        return None
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _short(value: object) -> str:
    return repr(value)[:40]


class LogLines:
    """Bytes from a job's stdout/stderr pipe, as at most ``max_lines`` LOG lines."""

    def __init__(self, max_lines: int) -> None:
        self.max_lines = max_lines
        self.lines = 0
        self.suppressed = 0
        self._partial = b""
        self._cut = False

    def feed(self, data: bytes) -> list[str]:
        out: list[str] = []
        pending = self._partial + data
        *complete, self._partial = pending.split(b"\n")
        for line in complete:
            if self._cut:
                self._cut = False  # the rest of an over-long line: already noted
                continue
            self._add(line, out)
        if len(self._partial) > LOG_LINE_CHARS:
            if not self._cut:
                self._add(self._partial, out)
            self._partial = b""
            self._cut = True
        return out

    def close(self) -> list[str]:
        out: list[str] = []
        if self._partial and not self._cut:
            self._add(self._partial, out)
        self._partial = b""
        return out

    def _add(self, raw: bytes, out: list[str]) -> None:
        if self.lines >= self.max_lines:
            self.suppressed += 1
            return
        self.lines += 1
        text = raw.decode("utf-8", "replace")
        if len(text) > LOG_LINE_CHARS:
            text = text[:LOG_LINE_CHARS] + " ... [line cut]"
        out.append(text)
        if self.lines == self.max_lines:
            out.append(
                f"[nnhost] this job reached its limit of {self.max_lines} lines of output; "
                "further output is not sent."
            )

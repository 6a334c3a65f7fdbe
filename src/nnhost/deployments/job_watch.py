"""Reading what a job's process says, as the untrusted input it is.

A job's process runs a stranger's code, and that code may have got past the
Python layer: every message it sends is checked here before anything else in
the server sees it. A message is accepted only if it is an event for *the*
job handed to that process, in the one allowed order (RUNNING, then LOG
lines, then COMPLETED or ERROR; an ERROR may also come first, when the request
cannot be read), with fields of the right types and sizes, and no more LOG
lines than the job's own capture lets through. COMPLETED must name
the size the result file really has. Anything else is a violation: the replica
kills the process and fails the job with a clear ERROR. Nothing here raises on
bad input.

`LogLines` turns the bytes a job's process writes to its stdout and stderr
(native writes and Python warnings included) into LOG lines, capped per line
and per job.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from ..execution.events import JobEvent, JobSpec

MAX_DESCRIPTION = 128 * 1024
MAX_LOG_CHARS = 8_192 + 64
MAX_META_KEYS = 32
LOG_LINE_CHARS = 8_192


class Violation(str):
    """Why a message was refused (a str, for the job's ERROR description)."""


class JobWatch:
    """The state of one job as its process reports it; `check` accepts or refuses a message."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.running = False
        self.finished = False
        self.log_events = 0

    def check(self, message: dict[str, Any]) -> Union[JobEvent, Violation]:
        if self.finished:
            return Violation("it sent a message after its job had finished")
        if message.get("type") != "event":
            return Violation(f"it sent an unexpected message ({_short(message.get('type'))})")
        if set(message) - {"type", "job_id", "status", "description", "meta", "result_size"}:
            return Violation("it sent an event with unknown fields")
        if message.get("job_id") != self.spec.job_id:
            return Violation("it sent an event for another job")
        status = message.get("status")
        description = message.get("description", "")
        if not isinstance(description, str):
            return Violation("it sent an event whose description is not text")
        limit = MAX_LOG_CHARS if status == "LOG" else MAX_DESCRIPTION
        if len(description) > limit:
            return Violation(f"it sent a {status} event over {limit} characters")
        meta = message.get("meta")
        if meta is not None and not _plain_meta(meta):
            return Violation("it sent an event with malformed meta")
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
        if status == "COMPLETED":
            if not self.running:
                return Violation("it reported COMPLETED without RUNNING")
            size = message.get("result_size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
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
        return Violation(f"it sent an event with an unknown status ({_short(status)})")


def _plain_meta(meta: object) -> bool:
    if not isinstance(meta, dict) or len(meta) > MAX_META_KEYS:
        return False
    for key, value in meta.items():
        if not isinstance(key, str) or len(key) > 64:
            return False
        if not isinstance(value, (int, float, str, bool, type(None))):
            return False
        if isinstance(value, str) and len(value) > 256:
            return False
    return True


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

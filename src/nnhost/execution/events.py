"""What crosses the seam between a replica process and the rest of nnhost.

A worker receives a `JobSpec` and answers with `JobEvent`s. Both are plain
dataclasses of JSON-native fields, so the same shapes travel in a job's
channel messages (`messages.Run`, `messages.Event`) and a Ray actor's
reports.

The rules about what a job may say are here too, once, because both sides
of the replica boundary apply them: a job's process holds itself to them
(`cut_description`), and the parent side (`replicas.job_watch`) and the
controller (`controller.intake`) check them with the same `event_problem`. A limit
defined once cannot differ between the layer that obeys it and the layers
that enforce it, so no layer refuses what another let through.

Nothing here knows about HTTP, websockets or the job database.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, TypeGuard

#: The statuses that end a job (`jobs.job.Status.final` is defined by this set).
FINAL_STATUSES: frozenset[str] = frozenset({"COMPLETED", "ERROR"})
#: What a job may report: its own progress, never a place in the queue.
WORKER_STATUSES: frozenset[str] = frozenset({"RUNNING", "LOG"}) | FINAL_STATUSES

#: Longest description of an event that is not a LOG line (a status message,
#: an ERROR's traceback), in characters. One value for every layer, so that no
#: layer refuses what another lets through: the job's process cuts what it
#: sends to it, marker and notices included (`cut_description`); the parent
#: side adds its own notes within it (`cut_description` again); the watcher
#: and the intake refuse anything longer (`event_problem`), which only a
#: process that broke its rules can send. 16 Ki characters because the
#: channel is a layer too: JSON writes a character in at most 12 bytes (one
#: outside the BMP as two ``\u`` escapes), so the longest description fits
#: one packet (`channel.MAX_MESSAGE`, 256 KiB) with the rest of its event; at
#: 64 Ki, 64 Ki of "é" made a packet the channel refused. It still holds a
#: traceback of a few hundred frames.
MAX_DESCRIPTION_CHARS = 16 * 1024
#: Where a cut description says so.
CUT_MARK = " [cut]"
#: A LOG line is cut here, by the job's capture (`capture`) and by the
#: parent's reader of its output pipe (`replicas.job_watch.LogLines`)...
LOG_LINE_CHARS = 8_192
#: ...which add a short note of the cut (at most this long in all).
MAX_LOG_CHARS = LOG_LINE_CHARS + 64
#: An event's meta is a flat table of a few short scalars (runtime, sizes).
MAX_META_KEYS = 32
MAX_META_KEY_CHARS = 64
MAX_META_TEXT_CHARS = 256
#: The fields of an event (a `JobEvent`, or a job's message without its ``type``).
EVENT_FIELDS = frozenset({"job_id", "status", "description", "meta", "result_size"})

#: A job id: a file and object name in the stores, so letters, digits, ``-``
#: and ``_`` only, at most 64 of them (the server issues 32 hex digits).
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def is_job_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a job id the server could have issued (never raises)."""
    return isinstance(value, str) and JOB_ID.fullmatch(value) is not None


@dataclass
class JobSpec:
    """Everything a worker needs to run one request."""

    job_id: str
    #: Where the serialized trace lies (written by the API process).
    payload_path: str
    #: The payload is zstd-compressed, and the result must be too.
    compress: bool
    #: Per-request model environment (`_remoteable_set_env`).
    env: dict[str, Any] = field(default_factory=dict)
    #: Where to write the result blob (the worker writes it directly).
    result_path: str = ""
    #: Seconds of execution allowed.
    time_limit: float = 3600.0
    #: Largest result blob the server will keep, in bytes (0 = no limit).
    max_result_bytes: int = 0
    #: Open descriptors of the payload and the result file, when the server
    #: handed them over instead of paths (a contained worker sees no paths).
    payload_fd: int = -1
    result_fd: int = -1
    #: At most this many LOG lines are forwarded from one job.
    max_log_lines: int = 10_000
    #: The snapshot of the PEFT adapter ``env`` names, found by the server
    #: (`models.adapters`); the job's process gets its files as descriptors.
    adapter_path: str = ""
    adapter_fds: list[int] = field(default_factory=list)
    #: The Python the client ran on (``3.12.1``, or empty): the payload was pickled
    #: there, and what it records that this Python cannot is translated or refused
    #: (`execution.unpickling.python_versions`).
    client_python: str = ""
    #: Whose job it is (the account): a job's process that ran it may run that
    #: account's next jobs, never another's (`replicas.slots`). Not sent to the job.
    owner: str = ""
    #: The nnsight version of the runtime that runs it (`nnhost.runtimes`); empty:
    #: the host's own. The replica chooses the job's process by it. Not sent to the job.
    runtime: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class JobEvent:
    """One thing that happened to a job inside a replica.

    ``status`` is a lifecycle name (``RUNNING``, ``COMPLETED``, ``ERROR``) or
    ``LOG``. On COMPLETED, ``result_size`` is the byte size of the blob written
    at the spec's ``result_path``.
    """

    job_id: str
    status: str
    description: str = ""
    meta: Optional[dict[str, Any]] = None
    result_size: Optional[int] = None

    @property
    def final(self) -> bool:
        """Whether this event ends its job (COMPLETED or ERROR)."""
        return self.status in FINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cut_description(text: str, tail: str = "") -> str:
    """``text`` then ``tail``, ``text`` cut (and marked) so that both fit `MAX_DESCRIPTION_CHARS`."""
    room = MAX_DESCRIPTION_CHARS - len(tail)
    if len(text) > room:
        text = text[: max(0, room - len(CUT_MARK))] + CUT_MARK
    return (text + tail)[:MAX_DESCRIPTION_CHARS]


def event_problem(fields: Mapping[str, Any]) -> Optional[str]:
    """What is wrong with an event's fields, or None; never raises.

    ``fields`` are a `JobEvent`'s (``vars(event)``) or a message of a job's
    process less its ``type``: the same check on both sides of the replica
    boundary. The answer completes "it sent an event ...". What an event may
    say given its job's state (the order of events, the lifecycle, the result
    file) is each side's own business.
    """
    if not EVENT_FIELDS.issuperset(fields):
        return "with unknown fields"
    job_id = fields.get("job_id")
    if not is_job_id(job_id):
        return f"with no valid job id ({_short(job_id)})"
    status = fields.get("status")
    if not isinstance(status, str) or status not in WORKER_STATUSES:
        return f"with an unknown status ({_short(status)})"
    description = fields.get("description", "")
    if not isinstance(description, str):
        return f"whose description is a {type(description).__name__}, not text"
    limit = MAX_LOG_CHARS if status == "LOG" else MAX_DESCRIPTION_CHARS
    if len(description) > limit:
        return f"({status}) whose description of {len(description)} characters is over {limit}"
    meta = fields.get("meta")
    if meta is not None and not _plain_meta(meta):
        return "with malformed meta"
    if meta is not None and "runtime" in meta and runtime_of(meta) is None:
        return f"whose runtime {_short(meta['runtime'])} is not a duration"
    size = fields.get("result_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        return f"whose result_size {_short(size)} is not a size"
    return None


def runtime_of(meta: Optional[Mapping[str, Any]]) -> Optional[float]:
    """The runtime a final event reports, if it is a plausible number of seconds."""
    value = (meta or {}).get("runtime")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _plain_meta(meta: object) -> bool:
    """A table of at most `MAX_META_KEYS` short names to scalars JSON can hold."""
    if not isinstance(meta, dict) or len(meta) > MAX_META_KEYS:
        return False
    for key, value in meta.items():
        if not isinstance(key, str) or len(key) > MAX_META_KEY_CHARS:
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if not isinstance(value, (int, float, str, bool, type(None))):
            return False
        if isinstance(value, str) and len(value) > MAX_META_TEXT_CHARS:
            return False
    return True


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

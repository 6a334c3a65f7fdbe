"""What crosses the seam between a replica process and the rest of nnhost.

A worker receives a `JobSpec` and answers with `JobEvent`s. Both are plain
dataclasses of JSON-native fields, so the same shapes can travel over a
multiprocessing pipe today and a Ray actor call tomorrow.

The rules about what a job may say are here too, once, because both sides
of the replica boundary apply them: a job's process holds itself to them
(`cut_description`), and the parent side (`deployments.job_watch`) and the
controller (`jobs.intake`) check them with the same `event_problem`. A limit
defined once cannot differ between the layer that obeys it and the layers
that enforce it, so no layer refuses what another let through.

Nothing here knows about HTTP, websockets or the job database.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, TypeGuard

#: The statuses that end a job (`jobs.job.Status.final` is defined by this set).
FINAL_STATUSES: frozenset[str] = frozenset({"COMPLETED", "ERROR"})

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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobEvent":
        return cls(**data)

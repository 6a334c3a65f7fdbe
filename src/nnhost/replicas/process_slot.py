"""A job's process as its replica keeps it: whose it is, what it runs, how it ended.

A module of its own because the job processes (`slots`) and their
bookkeeping while parked (`parking`) both hold slots, and the first uses
the second.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from ..execution.channel import Channel
from ..execution.events import JobSpec
from .job_watch import JobWatch, LogLines


@dataclass(eq=False)
class Slot:
    """A process that runs (or will run) one user's jobs."""

    pid: int
    channel: Channel
    log_fd: int = -1
    reusable: bool = False
    generation: int = 0
    ready: bool = False
    containment: Optional[dict[str, Any]] = None
    #: The nnsight runtime it belongs to (`replicas.runtimes`); empty: the host's own.
    runtime: str = ""
    job: Optional[JobSpec] = None
    watch: Optional[JobWatch] = None
    lines: Optional[LogLines] = None
    started: float = 0.0
    kill_reason: Optional[str] = None
    exit_code: Optional[int] = None
    out_of_memory: bool = False
    exited: threading.Event = field(default_factory=threading.Event)
    #: Whose jobs it runs (`JobSpec.owner`), once it has run one; how many it ran.
    owner: str = ""
    jobs_run: int = 0
    #: Its job was sent with ``stay``: after the result, it says ready again or goes.
    staying: bool = False
    #: When its last job ended (settling) or it was parked.
    since: float = 0.0

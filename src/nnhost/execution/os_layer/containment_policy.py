"""What the operator asked of the OS layers: the one value every layer of containment reads.

A module of its own so that each layer (`containment`, `filesystem`,
`job_layers`) reads it without importing another layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024


@dataclass
class ContainmentPolicy:
    """How to shut a worker in (JSON-native: it travels to the worker process)."""

    enabled: bool = True
    #: Folders and files the worker must not see (data dir, model cache, ...).
    hide: list[str] = field(default_factory=list)
    #: Size of the private scratch tmpfs at /tmp.
    scratch_bytes: int = 256 * MiB
    #: Memory a job may use on top of what the loaded worker already maps (0: 8 GiB).
    memory_bytes: int = 0
    #: Largest file the worker may write (the result cap), 0 for no limit.
    max_file_bytes: int = 0
    #: Workers run as uid/gid ``uid_base + pid``.
    uid_base: int = 200_000
    open_files: int = 512
    #: Threads and processes on top of what the loaded worker has.
    extra_tasks: int = 32

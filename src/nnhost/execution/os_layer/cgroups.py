"""A memory and task limit for each job's process, as a control group.

``RLIMIT_DATA`` counts private writable memory only: a job can take as much
as it likes through a shared anonymous mapping, ``/dev/shm`` or its ``/tmp``.
A cgroup's memory controller counts every page charged to the job's processes,
whatever kind of mapping it came from. Each job's process is put into a group
of its own (under the server's own group, in the cgroup v1 ``memory`` and
``pids`` hierarchies) before it is handed a job; its children inherit the group. When the job is over the
group is removed.

This is driven from the replica's side (the job's process has dropped every
privilege by then, and never sees the cgroup files writable). Where the
machine has no usable cgroup v1 memory controller (not root, not mounted,
cgroup v2 only: not supported yet), `JobGroups.problem` says
why and job processes fall back to ``RLIMIT_AS``.
"""

from __future__ import annotations

import os
import time
from typing import Optional

ROOT = "/sys/fs/cgroup"


def _group_path(controller: str, pid: "int | str" = "self") -> Optional[str]:
    """``pid``'s group in ``controller``'s v1 hierarchy ("" for the unified one)."""
    try:
        with open(f"/proc/{pid}/cgroup") as file:
            for line in file:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controller in controllers.split(","):
                    return path
    except OSError:
        return None
    return None


class JobGroups:
    """Creates, fills and removes one memory (+ pids) group per job process."""

    def __init__(self, name: str) -> None:
        self.problem: Optional[str] = None
        self.memory_base: Optional[str] = None
        self.pids_base: Optional[str] = None
        safe = "".join(c if c.isalnum() else "-" for c in name)[:60]
        if os.geteuid() != 0:
            self.problem = "needs root"
            return
        memory = _group_path("memory")
        if memory is None or not os.path.isdir(os.path.join(ROOT, "memory")):
            self.problem = "no cgroup v1 memory controller mounted"
            return
        self.memory_base = os.path.join(ROOT, "memory", memory.lstrip("/"), f"nnhost-{os.getpid()}-{safe}")
        pids = _group_path("pids")
        if pids is not None and os.path.isdir(os.path.join(ROOT, "pids")):
            self.pids_base = os.path.join(ROOT, "pids", pids.lstrip("/"), f"nnhost-{os.getpid()}-{safe}")
        for base in (self.memory_base, self.pids_base):
            if base:
                sweep_stale(os.path.dirname(base))
        try:
            os.makedirs(self.memory_base, exist_ok=True)
            if self.pids_base:
                os.makedirs(self.pids_base, exist_ok=True)
        except OSError as error:
            self.problem = f"cannot create a cgroup: {error.strerror}"
            self.memory_base = self.pids_base = None

    @property
    def available(self) -> bool:
        return self.problem is None

    def _paths(self, pid: int) -> list[str]:
        return [os.path.join(base, f"job-{pid}") for base in (self.memory_base, self.pids_base) if base]

    def attach(self, pid: int, memory_bytes: int, tasks: int) -> None:
        """Put process ``pid`` (not yet running user code) into a fresh group with these limits."""
        memory, *rest = self._paths(pid)
        os.makedirs(memory, exist_ok=True)
        _write(memory, "memory.limit_in_bytes", memory_bytes)
        # No swap for a job: what it takes, it holds in memory. Where swap is not
        # accounted (no memsw files), swappiness 0 still keeps the kernel from
        # paging the job out at its limit, which would slow it to its time limit
        # instead of ending it at once as out of memory.
        for key, value in (("memory.memsw.limit_in_bytes", memory_bytes), ("memory.swappiness", 0)):
            try:
                _write(memory, key, value)
            except OSError:
                pass
        _write(memory, "cgroup.procs", pid)
        for pids in rest:
            os.makedirs(pids, exist_ok=True)
            _write(pids, "pids.max", tasks)
            _write(pids, "cgroup.procs", pid)

    def ran_out_of_memory(self, pid: int) -> bool:
        """Whether the kernel killed a process of that job for going over its memory."""
        path = os.path.join(self.memory_base or "", f"job-{pid}", "memory.oom_control")
        try:
            with open(path) as file:
                for line in file:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value) > 0:
                        return True
        except (OSError, ValueError):
            pass
        return self.reached_limit(pid)

    def reached_limit(self, pid: int) -> bool:
        """Whether that job's memory ever reached its limit (the kernel then reclaims or kills)."""
        path = os.path.join(self.memory_base or "", f"job-{pid}", "memory.failcnt")
        try:
            with open(path) as file:
                return int(file.read()) > 0
        except (OSError, ValueError):
            return False

    def remove(self, pid: int, wait: float = 2.0) -> None:
        """Remove the job's groups once its processes are gone (the kernel reaps them shortly)."""
        deadline = time.monotonic() + wait
        for path in self._paths(pid):
            _remove_when_empty(path, deadline)

    def close(self, wait: float = 5.0) -> None:
        """Remove every group this replica made, once the processes in them are gone.

        Called as the replica stops, just after its host killed the job
        processes: some are still exiting, and a group with a process in it
        cannot be removed. Not waiting left a group per server started, and
        each memory group holds one of the kernel's 65,535 ids until removed.
        """
        deadline = time.monotonic() + wait
        for base in (self.memory_base, self.pids_base):
            if base:
                _remove_groups(base, deadline)


def sweep_stale(parent: str) -> int:
    """Remove the empty groups that servers no longer running left in ``parent``; how many.

    A server killed outright (SIGKILL, a crash) never removes its groups
    (`JobGroups.close`). They are named for the server's pid
    (``nnhost-PID-...``): where that pid is not running, whatever of them is
    empty goes. A group with a process in it cannot be removed, so none that
    is in use is touched.
    """
    removed = 0
    try:
        entries = os.listdir(parent)
    except OSError:
        return 0
    for entry in entries:
        owner = entry.split("-")[1] if entry.startswith("nnhost-") and entry.count("-") >= 2 else ""
        if not owner.isdigit() or os.path.exists(f"/proc/{owner}"):
            continue
        # No waiting: a group still in use stays as it is.
        removed += _remove_groups(os.path.join(parent, entry), time.monotonic())
    return removed


def _remove_groups(base: str, deadline: float) -> bool:
    """Remove ``base`` and its job groups, each once empty (`_remove_when_empty`); whether it went."""
    try:
        entries = [entry for entry in os.listdir(base) if entry.startswith("job-")]
    except OSError:
        return False
    for entry in entries:
        _remove_when_empty(os.path.join(base, entry), deadline)
    _remove_when_empty(base, deadline)
    return not os.path.exists(base)


def _remove_when_empty(path: str, deadline: float) -> None:
    """rmdir ``path``, trying again until ``deadline`` while something is still in it."""
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


def group_memory(pid: int) -> Optional[int]:
    """Memory charged to ``pid``'s own job group (`JobGroups.attach`), or None where it has none.

    Anonymous memory and tmpfs files (its ``/tmp``): what the process keeps,
    whether it maps it or not. Pages the host shares with it copy-on-write
    are charged to the host's group, so they do not count; the page cache of
    files it read or wrote does not either (the kernel frees it at will).
    Read from the kernel, in O(1): the group's path from ``/proc``, which the
    process cannot change (it has no write access to any group).
    """
    path = _group_path("memory", pid)
    if path is None or os.path.basename(path) != f"job-{pid}":
        return None
    try:
        counts = {}
        with open(os.path.join(ROOT, "memory", path.lstrip("/"), "memory.stat")) as file:
            for line in file:
                key, _, value = line.partition(" ")
                if key in ("rss", "shmem"):
                    counts[key] = int(value)
        return counts["rss"] + counts["shmem"]
    except (OSError, ValueError, KeyError):
        return None


def _write(folder: str, name: str, value: int) -> None:
    with open(os.path.join(folder, name), "w") as file:
        file.write(str(value))

"""The host's side of a job process parked between two jobs of its owner: stop it, or kill it.

A job's process that ran one user's job may wait for that user's next
(`replicas.slots`, ``jobs_per_process``). Its parent, the host (or the
template), stops it with SIGSTOP while it waits, so nothing its job left
behind runs, and kills it instead when stopping is not enough: a child
process would go on running, and memory it keeps is taken from everyone.
These are the kernel's answers, read from ``/proc``: nothing the job's
process says about itself is asked. Only the parent may act on the pid,
as only it knows the process has not been reaped (and its pid reused).
"""

from __future__ import annotations

import os
import signal
import time

from ..guard.process_state import child_processes
from ..os_layer.cgroups import group_memory


def park(pid: int, most_bytes: int) -> None:
    """Stop the job process ``pid`` between two jobs of its owner, or kill it.

    Stopped, none of its threads runs (whatever its job left behind); a child
    of its own would go on running, so a process with one is killed, as is one
    that does not stop at once, or that keeps more than ``most_bytes`` of
    memory of its own while it waits. Only its parent, this process, can be
    sure ``pid`` is still that process: it has not reaped it.
    """
    try:
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 0.5
        while not stopped(pid):
            if time.monotonic() > deadline:
                raise OSError("did not stop")
            time.sleep(0.001)
        if child_processes(pid):
            raise OSError("has a child")
        if kept_bytes(pid) > most_bytes:
            raise OSError("keeps too much memory")
    except ProcessLookupError:
        pass
    except OSError:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def kept_bytes(pid: int) -> int:
    """The memory the stopped process ``pid`` keeps of its own, by the kernel's count.

    Its job group's charge where it has one (`cgroups.group_memory`: O(1), and
    it counts its ``/tmp`` too), else the private part of its mappings, which
    the kernel finds by walking every page it maps: milliseconds of a CPU for
    each park, with a model's libraries mapped.
    """
    charged = group_memory(pid)
    return charged if charged is not None else private_bytes(pid)


def private_bytes(pid: int) -> int:
    """The memory only ``pid`` maps (what the host shares with it, copy-on-write, not counted)."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (group stop reaches each in turn)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat", "rb") as file:
                state = file.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue  # a thread that ended meanwhile
        if state not in (b"T", b"t"):
            return False
    return True


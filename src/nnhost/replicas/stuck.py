"""What a process that stopped answering is doing, in one line for the server log.

A job process that never says it is ready, or a worker that never forks one,
leaves nothing behind but a job that waits. When the replica gives up on one
it logs this: each thread's state, the kernel function it sleeps in and the
system call it is in (a device driver's ``ioctl``, a lock's ``futex``), and
the process's children. It reads ``/proc`` only, never signals or traces the
process, and never fails: what it cannot read it leaves out.
"""

from __future__ import annotations

import os

#: Enough for the threads of a stuck process, short enough for one log line.
MAX_CHARS = 3000
MAX_THREADS = 24


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as file:
            return file.read().strip()
    except OSError:
        return ""


def _thread(pid: int, tid: str) -> str:
    base = f"/proc/{pid}/task/{tid}"
    stat = _read(f"{base}/stat")
    # The command may hold spaces and parentheses: the state follows the last ")".
    state = stat.rpartition(")")[2].split()[0] if ")" in stat else "?"
    comm = _read(f"{base}/comm") or "?"
    wchan = _read(f"{base}/wchan") or "-"
    syscall = _read(f"{base}/syscall").split()
    call = f"syscall {syscall[0]}" if syscall and syscall[0].isdigit() else (syscall[0] if syscall else "-")
    return f"{tid} {comm} {state} wchan={wchan} {call}"


def process_snapshot(pid: int, depth: int = 1) -> str:
    """A process's threads and children, read from ``/proc``, and ``depth`` levels of children the same way.

    A worker in the mapped design does its forking in a child (the template):
    one level down is where it is stuck.
    """
    if not os.path.isdir(f"/proc/{pid}"):
        return f"pid {pid} is gone"
    command = _read(f"/proc/{pid}/cmdline").replace("\0", " ")[:200]
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        tids = []
    threads = [_thread(pid, tid) for tid in tids[:MAX_THREADS]]
    children = sorted({child for tid in tids for child in _read(f"/proc/{pid}/task/{tid}/children").split()})
    stack = " < ".join(line.split()[-1] for line in _read(f"/proc/{pid}/stack").splitlines()[:8])
    parts = [f"pid {pid} ({command or '?'}), {len(tids)} threads: " + "; ".join(threads)]
    if stack:
        parts.append(f"kernel stack: {stack}")
    if children:
        parts.append(f"children: {' '.join(children)}")
        if depth > 0:
            parts += [f"child {process_snapshot(int(child), depth - 1)}" for child in children[:4]]
    return " | ".join(parts)[:MAX_CHARS]

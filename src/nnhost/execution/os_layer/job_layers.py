"""The layers each job's own process gets, on top of its parent's.

The replica's long-lived process (`host`) is already shut in by the layers
of `containment` that hold for every job alike (read-only filesystem with the
server's folders hidden, no network, no environment, ``M_PERTURB``). It forks
the process for the next job into a fresh PID namespace, and that process,
still root and before it has seen any job, adds what must be new for each job:

===============  ============================================================
pid namespace    it is PID 1 of a namespace of its own: every process it
                 starts dies with it, and it sees no other process
filesystem       a mount namespace of its own, with a fresh ``/tmp``,
                 ``/dev/shm``, ``/var/tmp`` and ``/proc`` (of its namespace),
                 and an empty ``/sys/fs/cgroup`` (no figures of the server's
                 group, such as an earlier job's peak memory)
network          a network namespace of its own (loopback only, down)
ipc              its own System V IPC and POSIX message queue namespace
limits           ``RLIMIT_DATA``, ``NPROC``, ``NOFILE``, ``FSIZE``, ``CORE``,
                 and ``RLIMIT_AS`` where no memory cgroup holds it (see
                 `cgroups`, applied from the replica's side)
identity         uid/gid ``uid_base + its pid``, no capabilities,
                 ``no_new_privs``, not dumpable
shared pages     every shared, writable mapping inherited from the host (a
                 library's lock in ``/dev/shm``) made a private copy
heap             ``M_PERTURB`` off again: what the host freed was overwritten
                 then, and what this process frees no later job sees
system calls     a seccomp filter (`syscall_filter`): no program started, no
                 namespace or keyring, no mount, ptrace, bpf, io_uring
===============  ============================================================

Nothing here runs user code or reads anything a job wrote.
"""

from __future__ import annotations

import ctypes
import os
import resource
from typing import Callable, Optional

from . import containment, syscall_filter
from .containment import ContainmentReport
from .containment_policy import ContainmentPolicy
from .filesystem import mount_scratch
from .libc import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    M_PERTURB,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    c_library,
    mount,
    unshare,
)

CLONE_NEWPID = 0x20000000
CGROUPS = "/sys/fs/cgroup"
PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x02, 0x10, 0x20
MiB = 1024 * 1024


def host_pid() -> int:
    """This process's pid as the replica sees it (``getpid`` says 1 in its own namespace)."""
    try:
        with open("/proc/self/status") as file:
            for line in file:
                if line.startswith("NSpid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return os.getpid()


class PidNamespaces:
    """In the host: make the next child PID 1 of a new namespace, then go back.

    ``unshare(CLONE_NEWPID)`` changes only where this process's *next* child
    goes; ``setns`` to our own namespace resets that, so each fork gets a new one.
    """

    def __init__(self) -> None:
        self.problem: Optional[str] = None
        self._own = None
        if os.geteuid() != 0:
            self.problem = "needs root"
            return
        try:
            self._own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            self.problem = str(error)

    def fork(self) -> int:
        if self._own is None:
            return os.fork()
        libc = c_library()
        if libc.unshare(CLONE_NEWPID) != 0:
            import ctypes

            self.problem = f"unshare pid namespace: {os.strerror(ctypes.get_errno())}"
            os.close(self._own)
            self._own = None
            return os.fork()
        try:
            return os.fork()
        finally:
            if os.getpid() != 1:  # the parent: later children go back to our namespace
                libc.setns(self._own, CLONE_NEWPID)


def contain_job(
    policy: ContainmentPolicy, uid: int, memory_cgroup: bool, settle: Optional[Callable[[], None]] = None
) -> ContainmentReport:
    """Add this job's own layers; each one stands alone, and the report says which failed.

    ``settle`` (the mapped design's binding of the weights) runs once this
    process has its namespaces, its own ``/proc`` and private copies of the
    shared pages, and before its limits, identity and system-call filter. A
    GPU's driver needs it there: it refuses to start where ``/proc`` is
    another PID namespace's (measured on an H200: ``cudaGetDeviceCount``
    fails with error 304), and the device mappings it makes are shared and
    writable and must stay shared. It raises rather than being a layer that
    may fail: a job's process without its weights serves nothing.
    """
    report = ContainmentReport(enabled=policy.enabled)
    if not policy.enabled:
        if settle is not None:
            settle()
        return report
    root = os.geteuid() == 0

    def layer(name: str, action: Callable[[], object], needs_root: bool = False) -> None:
        if needs_root and not root:
            report.unavailable[name] = "needs root"
            return
        try:
            action()
            report.active.append(name)
        except Exception as error:  # each layer stands alone
            report.unavailable[name] = str(error) or type(error).__name__

    if os.getpid() == 1:
        report.active.append("pid namespace")
    else:
        report.unavailable["pid namespace"] = "the host could not create one"
    layer("ipc", lambda: unshare(CLONE_NEWIPC, "ipc namespace"), needs_root=True)
    layer("network", lambda: unshare(CLONE_NEWNET, "network namespace"), needs_root=True)
    layer("filesystem", lambda: _fresh_filesystem(policy, uid), needs_root=True)
    layer("shared pages", _private_shared_pages)
    layer("heap", _stop_perturbing)
    if settle is not None:
        settle()
    # After the settling: a GPU's context reserves far more address space and
    # starts more threads than a job's limits allow, and the limits are set
    # above what this process already holds (its weights included).
    layer("limits", lambda: _limits(policy, memory_cgroup))
    layer("identity", lambda: containment.drop_identity(uid, uid), needs_root=True)
    # Last: it refuses the calls the layers above made (unshare, mount).
    layer("system calls", syscall_filter.apply)
    return report


def _stop_perturbing() -> None:
    # The host overwrites what it frees (M_PERTURB), so nothing its heap held
    # reaches a process forked from it. This process serves one job and ends
    # with it: what it frees, no later job can read. Left on, glibc would fill
    # every allocation at malloc and again at free, and torch's large buffers
    # would cost eight times as long to allocate as on an unshielded machine.
    if c_library().mallopt(M_PERTURB, 0) != 1:
        raise OSError("mallopt(M_PERTURB, 0) refused")


def _fresh_filesystem(policy: ContainmentPolicy, uid: int) -> None:
    unshare(CLONE_NEWNS, "mount namespace")
    mount_scratch(policy, uid, uid)
    if os.getpid() == 1:
        # /proc of this job's own pid namespace: no other process is in it.
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    if os.path.isdir(CGROUPS):
        # The control groups' figures (the peak memory of the server's group,
        # hence of earlier jobs) are nobody's business: an empty folder instead.
        mount("tmpfs", CGROUPS, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")


def _private_shared_pages() -> None:
    """Make every shared, writable mapping inherited from the host this process's own copy.

    A lock a library made in the host before the fork (tqdm's, in
    ``/dev/shm``) is one page shared by every job's process: one job could
    hold it for the next, or read what the last one wrote. The page keeps its
    address and contents, as private memory, so code that uses it still works.
    """
    libc = c_library()
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    with open("/proc/self/maps") as file:
        shared = []
        for line in file:
            fields = line.split()
            perms = fields[1]
            if perms[1] == "w" and perms[3] == "s":
                start, end = (int(value, 16) for value in fields[0].split("-"))
                shared.append((start, end - start))
    for start, length in shared:
        contents = ctypes.string_at(start, length)
        address = libc.mmap(start, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
        if address != start:
            raise OSError(ctypes.get_errno(), f"cannot replace a shared mapping at {start:#x}")
        ctypes.memmove(start, contents, length)


def _vm_size() -> int:
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _limits(policy: ContainmentPolicy, memory_cgroup: bool) -> None:
    containment.apply_limits(policy, 0)
    if not memory_cgroup:
        # No group counts shared mappings: bound the address space instead
        # (coarser: it also counts reserved, untouched memory).
        memory = policy.memory_bytes or 8 * 1024 * MiB
        limit = _vm_size() + memory + policy.scratch_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

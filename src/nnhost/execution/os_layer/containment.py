"""Containing the worker process at the operating-system level.

The Python-level sandbox (`sandbox`) turns the obvious escapes into clear
refusals, but Python is not a security boundary: an allowed library can always
be coaxed into something. This module is the boundary. Once the model is loaded
(loading may need the network and the model cache), the worker process that
will run user code is shut in, layer by layer:

=============  ==============================================================
filesystem     a private mount namespace: every mount read-only; ``/tmp`` (and
               ``/dev/shm``, ``/var/tmp``) a small private tmpfs, the only place
               it can write; the server's data directory (database, payloads,
               results of every user), the model cache and home directories
               hidden under empty mounts; ``/etc/passwd`` and ``/etc/group``
               replaced by two-line stand-ins; ``/proc`` remounted so that other
               users' processes are invisible (``hidepid=2``).
network        a new, empty network namespace: only a loopback interface, down.
               The pipe to the server is a socketpair, so it keeps working.
identity       a user and group of its own (``uid_base + pid``, unique among
               live workers), no supplementary groups, no capabilities,
               ``no_new_privs`` (no setuid binary can give them back), not
               dumpable (no other process of that user can read its memory).
environment    every variable dropped but a few harmless ones, and the initial
               environment block in memory zeroed, so ``/proc/self/environ``
               shows nothing of the server's secrets either.
limits         ``RLIMIT_DATA`` (memory), ``RLIMIT_NPROC`` (no fork bombs),
               ``RLIMIT_NOFILE``, ``RLIMIT_FSIZE`` (no file larger than the
               largest result), ``RLIMIT_CORE`` 0.
memory         freed heap memory is overwritten (glibc ``M_PERTURB``), so an
               uninitialised tensor cannot show a previous request's data.
=============  ==============================================================

The worker never needs the data directory afterwards: the server hands it each
job's payload and result as open file descriptors (see `handoff`).

Each layer is attempted on its own; one the machine does not permit (not
root, no namespaces in a container) is reported with the reason, and the
worker runs with the others. `describe` turns the report into the line the
server logs at start-up and shows in ``/status``.

The filesystem layer, the largest, is `os_layer.filesystem`; the Linux calls the
layers make through ctypes are in `libc`. This module decides which layers are
applied, in what order, and must never report a layer active that failed.
"""

from __future__ import annotations

import ctypes
import os
import resource
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .containment_policy import ContainmentPolicy, MiB
from .filesystem import contain_filesystem
from .libc import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    M_PERTURB,
    MS_PRIVATE,
    MS_REC,
    PR_GET_PDEATHSIG,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    c_library,
    check,
    mount,
    unshare,
)

#: What may stay in the environment of a contained worker.
KEPT_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

LAYERS = ("filesystem", "network", "identity", "environment", "limits", "memory")


@dataclass
class ContainmentReport:
    active: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    enabled: bool = True

    def describe(self) -> str:
        if not self.enabled:
            return "containment off (trusted deployment): user code runs unconfined"
        text = "containment layers active: " + (", ".join(self.active) or "none")
        if self.unavailable:
            text += "; unavailable here: " + "; ".join(
                f"{name} ({why})" for name, why in self.unavailable.items()
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "active": list(self.active), "unavailable": dict(self.unavailable)}


# --- before loading: a private mount namespace ----------------------------------------


def enter_private_namespaces() -> Optional[str]:
    """Give this (still single-threaded) process its own mount and IPC namespaces.

    Done first thing in the worker, before any thread exists, so the whole
    process is in them; nothing is changed yet, so loading sees the usual files.
    Returns why it failed, or None.
    """
    try:
        unshare(CLONE_NEWNS | CLONE_NEWIPC, "mount+ipc namespaces")
        mount("none", "/", None, MS_REC | MS_PRIVATE)
        return None
    except (OSError, AttributeError) as error:
        return str(error)


# --- after loading: the layers ------------------------------------------------------------


def _wipe_environment() -> None:
    kept = {name: os.environ[name] for name in KEPT_ENVIRONMENT if name in os.environ}
    os.environ.clear()
    os.environ.update(kept)
    os.environ.update(
        HOME="/tmp", TMPDIR="/tmp", USER="nnhost", LOGNAME="nnhost",
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
    )
    # os.environ.clear() unsets the variables, but /proc/self/environ shows the
    # block the process was started with, which is still in memory: zero it.
    with open("/proc/self/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])
    if 0 < start < end and end - start < 16 * MiB:
        ctypes.memset(start, 0, end - start)


def _data_size() -> int:
    """Private writable memory this process maps now (what RLIMIT_DATA counts)."""
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def _tasks() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 64


def _set_limit(kind: int, value: int) -> None:
    resource.setrlimit(kind, (value, value))


def apply_limits(policy: ContainmentPolicy, reserve: int) -> list[str]:
    # RLIMIT_DATA rather than RLIMIT_AS: it counts the private writable memory
    # a job allocates, not address space reserved without being used (thread
    # stacks, allocator arenas, an accelerator's mappings), nor the read-only
    # weights. ``reserve`` leaves room for weights that may come back to host
    # memory later (a deployment demoted from an accelerator to WARM).
    memory = policy.memory_bytes or 8 * 1024 * MiB
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_DATA, _data_size() + memory + reserve)
    _set_limit(resource.RLIMIT_NOFILE, max(policy.open_files, 64))
    if policy.max_file_bytes:
        _set_limit(resource.RLIMIT_FSIZE, policy.max_file_bytes + MiB)
    _set_limit(resource.RLIMIT_NPROC, _tasks() + max(policy.extra_tasks, 8))
    return [f"memory {memory // MiB} MiB", f"{max(policy.extra_tasks, 8)} extra tasks"]


def drop_identity(uid: int, gid: int) -> None:
    libc = c_library()
    # Changing credentials clears the parent-death signal: keep the worker's.
    death_signal = ctypes.c_int(0)
    libc.prctl(PR_GET_PDEATHSIG, ctypes.addressof(death_signal), 0, 0, 0)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if death_signal.value:
        check(libc.prctl(PR_SET_PDEATHSIG, death_signal.value, 0, 0, 0), "prctl(PDEATHSIG)")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    with open("/proc/self/status") as file:
        effective = next(line for line in file if line.startswith("CapEff:")).split()[1]
    if int(effective, 16) != 0:
        raise OSError(f"capabilities remain ({effective})")


def contain(
    policy: ContainmentPolicy,
    namespaces_problem: Optional[str],
    reserve_bytes: int = 0,
    host_only: bool = False,
) -> ContainmentReport:
    """Apply every layer this machine permits; report which are active and why not the rest.

    ``reserve_bytes``: host memory to allow on top of a job's budget (weights
    held on an accelerator now, which may move to host memory later).
    ``host_only``: the process that forks one process per job (see `host`)
    keeps root and has no limits of its own; each job's process gets its
    identity, limits and the rest (see `job_layers`).
    """
    report = ContainmentReport(enabled=policy.enabled)
    if not policy.enabled:
        return report
    root = os.geteuid() == 0
    uid = gid = policy.uid_base + os.getpid()

    def layer(name: str, action: Callable[[], object], needs_root: bool = False) -> None:
        if needs_root and not root:
            report.unavailable[name] = "needs root"
            return
        try:
            action()
            report.active.append(name)
        except Exception as error:  # each layer stands alone
            report.unavailable[name] = str(error) or type(error).__name__

    if namespaces_problem:
        report.unavailable["filesystem"] = f"no mount namespace: {namespaces_problem}"
    else:
        layer("filesystem", lambda: contain_filesystem(policy, uid, gid), needs_root=True)
    layer("network", lambda: unshare(CLONE_NEWNET, "network namespace"), needs_root=True)
    layer("environment", _wipe_environment)
    layer("memory", lambda: check(0 if c_library().mallopt(M_PERTURB, 0xA5) == 1 else 1, "mallopt"))
    if host_only:
        return report
    layer("limits", lambda: apply_limits(policy, reserve_bytes))
    layer("identity", lambda: drop_identity(uid, gid), needs_root=True)
    return report

"""A seccomp filter for a job's process: the system calls no job needs are refused.

The other layers make a job's process poor in what it can reach; this one
makes the kernel's surface smaller, for a user who has beaten the Python
layer and calls the kernel directly (through ``ctypes``, say). Once applied
(last, after the process has taken its namespaces and dropped its identity;
see `job_layers`), the process and every thread or child it starts get
``EPERM`` for:

* starting a program (``execve``, ``execveat``): a library that would start
  ``python -c`` with code from the request (sympy's test runner does) fails;
* new namespaces (``unshare``, ``setns``, and ``clone`` with a namespace
  flag), above all a user namespace, which would hand back capabilities
  inside it;
* the kernel keyrings (``add_key``, ``keyctl``, ``request_key``): a key
  kept in the keyring of a job's uid would outlive the job's process;
* mounts, ``chroot``, module loading, ``kexec``, ``bpf``,
  ``perf_event_open``, ``userfaultfd`` (a classic exploitation aid),
  ``io_uring`` (its own path into the kernel, outside this filter), reading
  or writing another process's memory (``ptrace``, ``process_vm_*``), file
  handles, swap, ``reboot``, ``acct``, ``quotactl``, ``syslog``.

``clone3`` answers ``ENOSYS`` (its flags sit in memory the filter cannot
read), so the C library falls back to ``clone``, whose flags it can. Calls of
another architecture's table (the 32-bit ``int 0x80`` path, x32) end the
process.

It must never refuse what torch, numpy or the interpreter need to run a job
(threads, memory, the channel and log pipe), and it must never be applied to
a process that still has set-up to do: it cannot be taken back.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

from .libc import PR_SET_NO_NEW_PRIVS, prctl

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

# seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0 = 0, 4, 16

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

#: clone's namespace flags: a job makes threads and plain children, never namespaces.
CLONE_NAMESPACES = (
    0x00020000  # NEWNS
    | 0x02000000  # NEWCGROUP
    | 0x04000000  # NEWUTS
    | 0x08000000  # NEWIPC
    | 0x10000000  # NEWUSER
    | 0x20000000  # NEWPID
    | 0x40000000  # NEWNET
    | 0x00000080  # NEWTIME
)

REFUSED = (
    "execve", "execveat", "unshare", "setns", "add_key", "keyctl", "request_key",
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "bpf", "perf_event_open",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace",
    "process_vm_readv", "process_vm_writev", "name_to_handle_at", "open_by_handle_at",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "syslog",
)

# Numbers per architecture (audit arch, then the table), from the kernel's syscall tables.
_TABLES = {
    "x86_64": (0xC000003E, {
        "execve": 59, "execveat": 322, "unshare": 272, "setns": 308, "add_key": 248,
        "keyctl": 250, "request_key": 249, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "name_to_handle_at": 303,
        "open_by_handle_at": 304, "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163,
        "quotactl": 179, "syslog": 103, "clone": 56, "clone3": 435,
    }),
    "aarch64": (0xC00000B7, {
        "execve": 221, "execveat": 281, "unshare": 97, "setns": 268, "add_key": 217,
        "keyctl": 219, "request_key": 218, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "name_to_handle_at": 264,
        "open_by_handle_at": 265, "swapon": 224, "swapoff": 225, "reboot": 142, "acct": 89,
        "quotactl": 60, "syslog": 116, "clone": 220, "clone3": 435,
    }),
}
#: x86-64's x32 calls carry this bit; none is allowed.
_X32_BIT = 0x40000000


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for ``machine`` (``platform.machine()``) as BPF instructions."""
    if machine not in _TABLES:
        raise OSError(errno.ENOSYS, f"no system call table for {machine}")
    arch, table = _TABLES[machine]
    body: list[tuple[int, str, str, int]] = []  # (code, jump if true, jump if false, k); jumps by label

    def op(code: int, k: int, true: str = "", false: str = "") -> None:
        body.append((code, true, false, k))

    op(_LD_W_ABS, _ARCH)
    op(_JEQ_K, arch, "", "kill")
    op(_LD_W_ABS, _NR)
    if machine == "x86_64":
        op(_JGE_K, _X32_BIT, "kill", "")
    for name in REFUSED:
        op(_JEQ_K, table[name], "eperm", "")
    op(_JEQ_K, table["clone3"], "enosys", "")
    op(_JEQ_K, table["clone"], "", "allow")
    op(_LD_W_ABS, _ARG0)  # clone's flags (the low word: every namespace flag lives there)
    op(_JSET_K, CLONE_NAMESPACES, "eperm", "allow")
    returns = {
        "allow": _RET_ALLOW,
        "eperm": _RET_ERRNO | errno.EPERM,
        "enosys": _RET_ERRNO | errno.ENOSYS,
        "kill": _RET_KILL_PROCESS,
    }
    labels = {name: len(body) + i for i, name in enumerate(returns)}
    out = []
    for index, (code, true, false, k) in enumerate(body):
        jt = labels[true] - index - 1 if true else 0
        jf = labels[false] - index - 1 if false else 0
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise ValueError("filter too long for BPF's one-byte jumps")
        out.append((code, jt, jf, k))
    out.extend((_RET_K, 0, 0, value) for value in returns.values())
    return out


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def apply() -> None:
    """Install the filter on this process (and everything it starts); raises OSError if refused."""
    instructions = program(platform.machine())
    packed = b"".join(struct.pack("=HBBI", *instruction) for instruction in instructions)
    buffer = ctypes.create_string_buffer(packed, len(packed))
    prog = _SockFprog(len(instructions), ctypes.cast(buffer, ctypes.c_void_p))
    # Without no_new_privs only a privileged process may install a filter;
    # the identity layer sets it already, this makes the layer stand alone.
    prctl("no_new_privs", PR_SET_NO_NEW_PRIVS, 1)
    prctl("seccomp", PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog))

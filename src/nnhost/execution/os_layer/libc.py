"""The Linux calls containment needs that Python's ``os`` lacks: mount, unshare, prctl.

Thin ctypes wrappers and the flag values they take, shared by the layers every
job's process inherits (`containment`, `os_layer.filesystem`) and those each job
adds (`job_layers`). Each wrapper raises `OSError` with the call's errno when
the kernel refuses.

It must never decide what to mount, hide or drop: it only makes the calls it is
asked to make, and never swallows a failure (but `die_with_parent`'s, said there).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from typing import Optional

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_GET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 2, 4, 38
M_PERTURB = -6

_libc = None


def c_library() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return _libc


def check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mount(source: Optional[str], target: str, fstype: Optional[str], flags: int, data: str = "") -> None:
    def encode(s: Optional[str]) -> Optional[bytes]:
        return s.encode() if s is not None else None

    check(
        c_library().mount(encode(source), encode(target), encode(fstype), flags, encode(data) if data else None),
        f"mount {target}",
    )


def unshare(flags: int, what: str) -> None:
    check(c_library().unshare(flags), f"unshare {what}")


def prctl(what: str, option: int, arg2: int = 0, arg3: int = 0) -> None:
    check(c_library().prctl(option, arg2, arg3, 0, 0), what)


def die_with_parent() -> None:
    """Have the kernel kill this process when the API process dies, even by SIGKILL.

    Otherwise an orphaned worker could finish a job nobody will record, and the
    restarted server would run it again.
    """
    try:
        prctl("prctl(PDEATHSIG)", PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        # The one call here whose failure is let go: not Linux, and the pipe's
        # EOF still ends the worker after its job.
        pass
    if os.getppid() == 1:
        sys.exit(0)  # the parent died before we could ask

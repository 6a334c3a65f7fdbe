"""The filesystem layer of containment: what a contained worker can see and write.

`contain` (`containment`) applies it once to the replica's process: every mount
read-only, a small private ``/tmp`` (and ``/dev/shm``, ``/var/tmp``) the only
place to write, the server's data directory, the model cache and home
directories hidden under empty mounts, ``/etc/passwd`` and ``/etc/group``
replaced by stand-ins, ``/proc`` with ``hidepid=2``. `mount_scratch` is applied
again in each job's own mount namespace (`job_layers`).

It must never leave the root filesystem writable (the layer fails instead), and
never hide the folders Python imports from: a worker that cannot import is no
safer, only broken.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import TYPE_CHECKING, Optional

from .libc import MS_BIND, MS_MOVE, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY, MS_REC, MS_REMOUNT, mount

if TYPE_CHECKING:
    from .containment_policy import ContainmentPolicy

MiB = 1024 * 1024
#: The import roots under /tmp, found once per process tree (see `mount_scratch`).
_tmp_roots: Optional[list[str]] = None

#: Hidden by default, besides the server's own folders.
DEFAULT_HIDDEN = ("/root", "/home", "/run", "/var/run", "/mnt", "/media", "/srv", "/var/log",
                  "/var/lib", "/etc/shadow", "/etc/gshadow", "/etc/ssh", "/opt")


def _mounts() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as file:
        for line in file:
            parts = line.split()
            points.append(parts[4].replace("\\040", " "))
    return points


def _flags_of(point: str) -> int:
    flags = 0
    with open("/proc/self/mountinfo") as file:
        for line in file:
            parts = line.split()
            if parts[4] == point:
                options = parts[5].split(",")
                flags = (MS_NOSUID if "nosuid" in options else 0) | (MS_NODEV if "nodev" in options else 0) | (
                    MS_NOEXEC if "noexec" in options else 0
                )
    return flags


#: Where a job may write: each a private tmpfs of its own (`mount_scratch`).
SCRATCH = ("/tmp", "/dev/shm", "/var/tmp")


def mount_scratch(policy: ContainmentPolicy, uid: int, gid: int) -> None:
    """A fresh, empty ``/tmp`` (and ``/dev/shm``, ``/var/tmp``) owned by ``uid``.

    Done once for the replica's process and again in each job's own mount
    namespace, so that nothing one job leaves in ``/tmp`` is there for the next.
    """
    options = f"mode=0700,uid={uid},gid={gid}"
    # Python itself may live under /tmp (a checkout there, and its venv): hold
    # those folders open, cover /tmp, then bind them back, read-only. Finding
    # them resolves the path of every loaded package, a fifth of a job
    # process's CPU; what the replica's process kept when it covered its own
    # /tmp is all a job forked from it can import from, so jobs reuse that.
    global _tmp_roots
    if _tmp_roots is None:
        _tmp_roots = _import_roots_under("/tmp")
    kept = _tmp_roots
    handles = [os.open(root, os.O_RDONLY | os.O_DIRECTORY) for root in kept]
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={policy.scratch_bytes},{options}")
    for root, handle in zip(kept, handles):
        os.makedirs(root, mode=0o755, exist_ok=True)
        mount(f"/proc/self/fd/{handle}", root, None, MS_BIND | MS_REC)
        mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _flags_of(root))
        os.close(handle)
    for point in SCRATCH[1:]:
        if os.path.isdir(point) and not os.path.islink(point):
            mount("tmpfs", point, "tmpfs", MS_NOSUID | MS_NODEV, f"size={16 * MiB},{options}")
    # Stand-ins for the user databases: the machine's accounts are nobody's business.
    stand_ins = {
        "/etc/passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nnnhost:x:{uid}:{gid}:nnhost worker:/tmp:/usr/sbin/nologin\n",
        "/etc/group": f"root:x:0:\nnnhost:x:{gid}:\n",
    }
    os.makedirs("/tmp/.nnhost-etc", mode=0o755, exist_ok=True)
    for path, text in stand_ins.items():
        if os.path.isfile(path):
            stand_in = f"/tmp/.nnhost-etc/{os.path.basename(path)}"
            with open(stand_in, "w") as file:
                file.write(text)
            os.chmod(stand_in, 0o644)
            mount(stand_in, path, None, MS_BIND)


def contain_filesystem(policy: ContainmentPolicy, uid: int, gid: int) -> None:
    mount_scratch(policy, uid, gid)
    hidden = dict.fromkeys(os.path.realpath(p) for p in list(policy.hide) + list(DEFAULT_HIDDEN) if p)
    for real in sorted(hidden, key=len):
        if real in ("/", "/tmp") or real.startswith("/tmp/") or not os.path.lexists(real):
            # Already gone from view behind the scratch tmpfs, or nothing there.
            continue
        if os.path.isdir(real):
            _hide_directory(real)
        else:
            mount("/dev/null", real, None, MS_BIND)
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    except OSError:
        pass  # the old /proc stays; it is made read-only with the rest
    keep_writable = set(SCRATCH)
    for point in sorted(set(_mounts()), key=len, reverse=True):
        if point in keep_writable or point.startswith("/tmp/"):
            continue
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _flags_of(point))
        except OSError:
            if point == "/":
                raise
    probe = "/.nnhost-write-probe"
    try:
        with open(probe, "w"):
            pass
        os.unlink(probe)
        raise OSError("the root filesystem is still writable")
    except OSError as error:
        if error.errno is None:
            raise


def _import_roots() -> list[str]:
    """Where Python finds modules: these must stay visible, whatever folder they are in."""
    roots = [sys.base_prefix, sys.prefix] + [p for p in sys.path if p]
    # Packages installed in editable mode are found by a finder, not sys.path:
    # keep the folder each loaded top-level package came from.
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if "." not in name and origin:
            roots.append(os.path.dirname(os.path.dirname(origin)) if origin.endswith("__init__.py")
                         else os.path.dirname(origin))
    return [r for r in dict.fromkeys(os.path.realpath(p) for p in roots) if os.path.isdir(r)]


def _import_roots_under(folder: str) -> list[str]:
    """The outermost import roots inside ``folder`` (nested ones come with them)."""
    keeps = [r for r in _import_roots() if r.startswith(folder.rstrip("/") + "/")]
    return [k for k in keeps if not any(k != o and k.startswith(o + "/") for o in keeps)]


_stages = itertools.count()


def _hide_directory(real: str) -> None:
    """Cover ``real`` with an empty read-only tmpfs, keeping Python's own folders in it.

    A Python installed under a home directory (pyenv, conda, a venv) must stay
    importable: those folders are bind-mounted aside first, then moved back
    into the otherwise empty tmpfs at their old paths.
    """
    keeps = _import_roots_under(real)
    staged = []
    for keep in keeps:
        stage = f"/tmp/.nnhost-keep/{next(_stages)}"
        os.makedirs(stage, exist_ok=True)
        mount(keep, stage, None, MS_BIND | MS_REC)
        staged.append((stage, keep))
    mount("tmpfs", real, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    for stage, keep in staged:
        os.makedirs(keep, mode=0o755, exist_ok=True)
        mount(stage, keep, None, MS_MOVE)
    mount(None, real, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)

"""What a hosted snapshot exposes to the Hub mirror, and what each file is called.

Why it exists: the Hub mirror (`nnhost.api.hub`) answers from folders on disk,
and this is the one place that reads them. It decides which names from a URL
are plain enough to look up (repo ids, revisions, repo-relative paths), which
files of a snapshot are servable and where they really live, and the
identities the Hub gives a file: its git blob id, or for a Git LFS file its
sha256 (the ETag `huggingface_hub` checks downloads against).

It knows nothing of HTTP; `nnhost.api.hub` turns its answers into responses,
and `nnhost.api.hub_info` into the Hub's JSON bodies.

What it must never do:

* never read outside the snapshot folder it was given, or the ``blobs``
  folder of the same cached repo (where the Hugging Face cache keeps the real
  files a snapshot links to): a symlink that lands anywhere else, a symlinked
  folder, ``..`` or any other odd segment, and ``.git`` are all refused;
* never count a weight file as servable unless ``serve_weights`` says so;
  ``files(include_weights=True)`` exists only so that a snapshot's derived id
  and its parameter counts can see them;
* never write: it only stats, walks and hashes.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
import stat
import threading
from pathlib import Path
from typing import Iterator, Optional, TypedDict

__all__ = [
    "WEIGHT_SUFFIXES",
    "LFS_THRESHOLD",
    "is_weight_file",
    "valid_repo_id",
    "valid_revision",
    "split_relative",
    "Snapshot",
    "FileIds",
]

#: File suffixes that hold weights (or other checkpoint payloads).
WEIGHT_SUFFIXES: tuple[str, ...] = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".h5",
    ".msgpack",
    ".ckpt",
    ".onnx",
)

#: Files at least this big are described as Git LFS files (as the Hub would).
LFS_THRESHOLD = 10 * 1024 * 1024

_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# One part of a repo id: what the Hub allows, minus anything that could be
# read as a path (no leading dot, no "--" which the cache uses as separator).
_REPO_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,95}")
_REVISION_CHARS = re.compile(r"[A-Za-z0-9_.\-/]{1,255}")


def is_weight_file(path: str) -> bool:
    """Whether ``path`` (a repo-relative file name) is a weight file."""
    return path.lower().endswith(WEIGHT_SUFFIXES)


# --------------------------------------------------------------------------
# Validation of what the URL names
# --------------------------------------------------------------------------


def valid_repo_id(repo_id: str) -> bool:
    parts = repo_id.split("/")
    if len(parts) not in (1, 2):
        return False
    return all(
        _REPO_PART.fullmatch(part) and ".." not in part and "--" not in part
        for part in parts
    )


def valid_revision(revision: str) -> bool:
    """A commit or a ref name, with nothing that could walk out of a folder."""
    if not _REVISION_CHARS.fullmatch(revision):
        return False
    # Git's own rules forbid these too: empty components, components starting
    # with a dot (".", "..", hidden staging folders), "..", and ".lock".
    return all(
        part and not part.startswith(".") and not part.endswith(".lock")
        for part in revision.split("/")
    ) and ".." not in revision


def split_relative(path: str) -> Optional[list[str]]:
    """The segments of a repo-relative path, or None if it is not a plain one."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        return None
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    return parts


# --------------------------------------------------------------------------
# Reading a snapshot safely
# --------------------------------------------------------------------------


class Snapshot:
    """One hosted repo at one commit: the folder and what may be read in it."""

    def __init__(self, repo_id: str, folder: Path, serve_weights: bool) -> None:
        self.repo_id = repo_id
        self.folder = folder
        self.serve_weights = serve_weights
        self.root = folder.resolve()
        roots = [self.root]
        # In the HF cache layout a snapshot's files are symlinks into the repo's
        # `blobs` folder: reading those is reading this repo, nothing more.
        if folder.parent.name == "snapshots":
            roots.append((folder.parent.parent / "blobs").resolve())
        self.roots = roots
        self.sha = folder.name if _COMMIT.fullmatch(folder.name) else self._derived_sha()

    def _derived_sha(self) -> str:
        """A stable 40-hex id for a folder not named by its commit."""
        digest = hashlib.sha1(b"nnhost-snapshot\0")
        for rel, real in self.files(include_weights=True):
            st = real.stat()
            digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        return digest.hexdigest()

    def _inside(self, real: Path) -> bool:
        return any(real == root or real.is_relative_to(root) for root in self.roots)

    def file(self, rel: str) -> Optional[Path]:
        """The real path of the servable file ``rel``, or None."""
        parts = split_relative(rel)
        if parts is None or parts[0] == ".git":
            return None
        if is_weight_file(rel) and not self.serve_weights:
            return None
        try:
            real = self.folder.joinpath(*parts).resolve(strict=True)
            if not self._inside(real) or not stat.S_ISREG(real.stat().st_mode):
                return None
        except (OSError, RuntimeError, ValueError):
            return None
        return real

    def files(self, include_weights: bool = False) -> Iterator[tuple[str, Path]]:
        """Every servable ``(relative path, real path)``, sorted, in the snapshot."""
        found = []
        for dirpath, dirnames, filenames in os.walk(self.folder, followlinks=False):
            base = Path(dirpath)
            # Real folders only: a symlinked folder is never walked into.
            dirnames[:] = sorted(
                d for d in dirnames if d != ".git" and not (base / d).is_symlink()
            )
            for name in filenames:
                rel = (base / name).relative_to(self.folder).as_posix()
                if is_weight_file(rel) and not (self.serve_weights or include_weights):
                    continue
                try:
                    real = (base / name).resolve(strict=True)
                    if self._inside(real) and stat.S_ISREG(real.stat().st_mode):
                        found.append((rel, real))
                except (OSError, RuntimeError, ValueError):
                    continue
        return iter(sorted(found))

    def last_modified(self) -> _dt.datetime:
        times = [real.stat().st_mtime for _, real in self.files()]
        if not times:
            times = [self.folder.stat().st_mtime]
        return _dt.datetime.fromtimestamp(max(times), tz=_dt.timezone.utc)


# --------------------------------------------------------------------------
# File identities: the Hub's ETag is the git blob id, or the sha256 for LFS
# --------------------------------------------------------------------------


class LfsInfo(TypedDict):
    """A large file's LFS identity: its sha256, size, and the size of its pointer file."""

    oid: str
    size: int
    pointerSize: int


class FileDescription(TypedDict):
    """What `FileIds.describe` says of a file."""

    size: int
    oid: str
    etag: str
    lfs: Optional[LfsInfo]


class FileIds:
    """Hashes of served files, computed once per (path, size, mtime)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, int, int], FileDescription] = {}

    @staticmethod
    def is_lfs(rel: str, size: int) -> bool:
        return is_weight_file(rel) or size >= LFS_THRESHOLD

    def describe(self, rel: str, real: Path) -> FileDescription:
        """``size``, ``oid`` (git blob id), ``lfs`` (None or sha256 and pointer info)."""
        st = real.stat()
        key = (str(real), st.st_size, st.st_mtime_ns)
        with self._lock:
            known = self._cache.get(key)
        if known is not None:
            return known
        size = st.st_size
        # A file from the HF cache is stored under its Hub etag: reuse it
        # rather than hashing (possibly many GB of) weights again.
        blob_name = real.name if real.parent.name == "blobs" else ""
        if self.is_lfs(rel, size):
            sha256 = blob_name if _SHA256.fullmatch(blob_name) else _hash_file(real, "sha256")
            pointer = (
                "version https://git-lfs.github.com/spec/v1\n"
                f"oid sha256:{sha256}\nsize {size}\n"
            ).encode()
            info: FileDescription = {
                "size": size,
                "oid": _git_blob_id(pointer),
                "etag": sha256,
                "lfs": {"oid": sha256, "size": size, "pointerSize": len(pointer)},
            }
        else:
            oid = blob_name if _COMMIT.fullmatch(blob_name) else _git_blob_file(real, size)
            info = {"size": size, "oid": oid, "etag": oid, "lfs": None}
        with self._lock:
            if len(self._cache) > 10000:
                self._cache.clear()
            self._cache[key] = info
        return info


def _hash_file(path: Path, algorithm: str, prefix: bytes = b"") -> str:
    digest = hashlib.new(algorithm)
    digest.update(prefix)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git_blob_file(path: Path, size: int) -> str:
    return _hash_file(path, "sha1", prefix=b"blob %d\0" % size)

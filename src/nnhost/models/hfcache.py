"""Placing a model folder into the Hugging Face cache layout, and finding it again.

A server that must start with no internet still loads its models through the
real `from_pretrained` path (with ``HF_HUB_OFFLINE=1``), which reads the cache
layout: ``HF_HOME/hub/models--{org}--{name}/snapshots/{commit}/...`` with
``refs/main`` naming the commit. Writing a model there, under a Hub-style id,
is all it takes for the unmodified loading code to find it.

The commit id is derived from the files' contents, so the same bytes always get
the same id (a rebuilt demo model is recognisably the same model).

This module only moves files; it never builds or loads a model.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Optional


def hub_cache_dir(hf_home: Optional[str | os.PathLike[str]] = None) -> Path:
    """The ``hub`` folder of a Hugging Face home (``HF_HUB_CACHE`` wins if set)."""
    if hf_home is None:
        explicit = os.environ.get("HF_HUB_CACHE")
        if explicit:
            return Path(explicit)
        hf_home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(hf_home) / "hub"


def repo_folder(repo_id: str, hf_home: Optional[os.PathLike[str]] = None) -> Path:
    """The cache folder of a model repo: ``models--org--name``."""
    return hub_cache_dir(hf_home) / ("models--" + repo_id.replace("/", "--"))


def content_commit(folder: Path) -> str:
    """A 40-hex commit id for a folder, from its file names and contents."""
    digest = hashlib.sha1()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def install_snapshot(
    source: Path, repo_id: str, hf_home: Optional[os.PathLike[str]] = None
) -> Path:
    """Copy the files of ``source`` into the cache as ``repo_id``'s ``main``.

    Returns the snapshot folder. Installing the same contents twice is a no-op;
    new contents become a new commit that ``refs/main`` points at.
    """
    commit = content_commit(source)
    repo = repo_folder(repo_id, hf_home)
    snapshot = repo / "snapshots" / commit
    if not snapshot.exists():
        staging = repo / "snapshots" / f".{commit}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging)
        try:
            os.replace(staging, snapshot)
        except OSError:
            # Another process installed the same commit first: same bytes, keep theirs.
            shutil.rmtree(staging, ignore_errors=True)
            if not snapshot.is_dir():
                raise
    refs = repo / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / "main.partial").write_text(commit)
    os.replace(refs / "main.partial", refs / "main")
    return snapshot


def find_snapshot(
    repo_id: str, revision: Optional[str] = None, hf_home: Optional[os.PathLike[str]] = None
) -> Optional[Path]:
    """The snapshot folder of ``repo_id`` at ``revision`` (a ref or a commit), if cached."""
    repo = repo_folder(repo_id, hf_home)
    revision = revision or "main"
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None

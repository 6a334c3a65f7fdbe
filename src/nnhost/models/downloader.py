"""Fetching an allowed model from the upstream Hub into the local model cache.

Why it exists: an operator may let users ask for models nobody listed
(``[[allow]]`` in nnhost.toml). The server must then get the checkpoint
itself, know its size before committing disk and memory to it, and show the
user how far the download has come. `huggingface_hub` would fetch the files,
but it decides on its own what to fetch, reads no sizes before, and reports
progress only to a terminal; so this module speaks the Hub's three plain
HTTP routes itself: the model info (``/api/models/{repo}/revision/{rev}``,
with each file's size), ranged reads of each safetensors file's header, and
the files (``/{repo}/resolve/{commit}/{file}``). ``HF_ENDPOINT`` names the
upstream (the real Hub by default, or another nnhost's mirror) and
``HF_TOKEN`` is sent for gated models.

Everything the upstream says is untrusted: file names are checked to be plain
relative paths before any is written, a file that arrives larger or smaller
than the listing claimed is refused, and a safetensors header that differs
from the one priced before the download is refused.

What it must never do:

* never write outside the cache folder of the repo it fetches
  (``HF_HOME/hub/models--org--name``); files are written to a hidden staging
  folder there and moved into place whole, so a half-fetched model is never
  seen by a loader;
* never fetch or follow a repository's code: ``*.py`` files are skipped unless
  the allow entry permits ``trust_remote_code``; nothing fetched is imported
  or run here;
* never read a weight file to size a model: only the headers, by range;
* never run on the API's event loop: every call blocks, and the controller
  calls it from a thread.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import quote

import httpx

from ..units import format_size
from .hfcache import hub_cache_dir, repo_folder
from .sizing import header_bytes

#: Files whose names end so are weights: with safetensors present, the others are skipped.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
                   ".onnx", ".gguf", ".ot", ".tflite")
#: Larger safetensors headers than this are not believed (real ones are well under 10 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: Written in a repo's cache folder once this module has fetched it (its mtime: last use).
MARKER = ".nnhost-fetched"
_COMMIT = re.compile(r"[0-9a-f]{40}")
_REPO_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,95}")
_REVISION = re.compile(r"[A-Za-z0-9_.\-/]{1,255}")
_CHUNK = 1024 * 1024

Progress = Callable[[int, int], None]


class DownloadRefused(RuntimeError):
    """The model cannot be fetched; the message is for the user who asked."""


@dataclass(frozen=True)
class RemoteFile:
    name: str
    #: Bytes the listing claims; what arrives must match.
    size: int


@dataclass
class Plan:
    """What fetching one model at one commit takes, known before any weight is read."""

    repo_id: str
    revision: str
    commit: str
    files: list[RemoteFile]
    #: Bytes of the weights as they will be held (in the allow entry's dtype).
    weight_bytes: int
    #: Each safetensors file's header as priced, to compare with what arrives.
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Bytes on disk once fetched."""
        return sum(file.size for file in self.files)


def plain_path(name: Any) -> Optional[list[str]]:
    """The segments of a repo-relative file name, or None unless it is a plain one."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\0" in name:
        return None
    parts = name.split("/")
    if any(part in ("", ".", "..") or part.startswith(".") for part in parts):
        return None  # also skips .gitattributes and hidden folders
    return parts


def valid_repo_id(repo_id: str) -> bool:
    parts = repo_id.split("/")
    return len(parts) in (1, 2) and all(
        _REPO_PART.fullmatch(part) and ".." not in part and "--" not in part for part in parts
    )


def valid_revision(revision: str) -> bool:
    return bool(_REVISION.fullmatch(revision)) and ".." not in revision and all(
        part and not part.startswith(".") and not part.endswith(".lock")
        for part in revision.split("/")
    )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


class HubDownloader:
    """Blocking fetches from one upstream Hub into one Hugging Face cache."""

    def __init__(self, hf_home: Path, endpoint: Optional[str] = None, token: Optional[str] = None,
                 timeout: float = 60.0) -> None:
        self.cache = hub_cache_dir(hf_home)
        self.hf_home = hf_home
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        token = token or os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # httpx drops the Authorization header on a redirect to another host (the Hub's CDN).
        self._client = httpx.Client(headers=headers, timeout=timeout, follow_redirects=True)
        #: Set when the server stops: a download in progress gives up at its next chunk.
        self.stopping = threading.Event()

    def close(self) -> None:
        """Stop: downloads in progress end (their staging folders are removed)."""
        self.stopping.set()

    # -- before the download ---------------------------------------------------------

    def plan(self, repo_id: str, revision: str, dtype: Optional[str], allow_code: bool) -> Plan:
        """What fetching ``repo_id`` takes: its files and the weights' size as ``dtype``."""
        if not valid_repo_id(repo_id) or not valid_revision(revision):
            raise DownloadRefused(f"{repo_id}@{revision} is not a repo id and revision the Hub has.")
        if _offline():
            raise DownloadRefused(
                f"{repo_id} is not in this server's cache, and the server is offline (HF_HUB_OFFLINE)."
            )
        url = f"{self.endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}"
        info = self._json(url, repo_id)
        commit = info.get("sha") if isinstance(info, dict) else None
        siblings = info.get("siblings") if isinstance(info, dict) else None
        if not isinstance(commit, str) or not _COMMIT.fullmatch(commit) or not isinstance(siblings, list):
            raise DownloadRefused(f"The Hub's description of {repo_id} is not one this server can read.")
        listed: list[RemoteFile] = []
        for sibling in siblings:
            name = sibling.get("rfilename") if isinstance(sibling, dict) else None
            size = sibling.get("size") if isinstance(sibling, dict) else None
            if plain_path(name) is None or not isinstance(size, int) or isinstance(size, bool) or size < 0:
                continue  # never a path out of the snapshot, never a file of unknown size
            assert isinstance(name, str)
            if name.endswith(".py") and not allow_code:
                continue  # the repository's own code is never fetched unless allowed
            listed.append(RemoteFile(name, size))
        safetensors = [f for f in listed if f.name.endswith(".safetensors")]
        if safetensors:
            listed = [f for f in listed if f.name.endswith(".safetensors")
                      or not f.name.lower().endswith(WEIGHT_SUFFIXES)]
        elif not any(f.name.lower().endswith(WEIGHT_SUFFIXES) for f in listed):
            raise DownloadRefused(f"The Hub lists no weight files for {repo_id}.")
        plan = Plan(repo_id, revision, commit, listed, 0)
        if safetensors:
            for file in safetensors:
                header = self._header(plan, file)
                plan.headers[file.name] = header
                plan.weight_bytes += sum(header_bytes(header, dtype).values())
        else:
            plan.weight_bytes = sum(f.size for f in listed if f.name.lower().endswith(WEIGHT_SUFFIXES))
        return plan

    def _json(self, url: str, repo_id: str) -> Any:
        try:
            response = self._client.get(url, params={"blobs": "true"})
        except httpx.HTTPError as error:
            raise DownloadRefused(f"The Hub could not be reached for {repo_id}: {error}") from None
        if response.status_code in (401, 403):
            raise DownloadRefused(
                f"{repo_id} is gated or private on the Hub, and this server's token (HF_TOKEN) "
                "does not give access to it."
            )
        if response.status_code == 404:
            raise DownloadRefused(f"The Hub has no model {repo_id} at that revision.")
        if response.status_code != 200:
            raise DownloadRefused(f"The Hub answered {response.status_code} for {repo_id}.")
        try:
            return response.json()
        except ValueError:
            raise DownloadRefused(f"The Hub's description of {repo_id} is not JSON.") from None

    def _url(self, plan: Plan, name: str) -> str:
        return f"{self.endpoint}/{plan.repo_id}/resolve/{plan.commit}/{quote(name)}"

    def _read_range(self, url: str, start: int, length: int) -> bytes:
        """``length`` bytes at ``start``; a server that ignores the range is read up to them only."""
        wanted = start + length
        with self._client.stream("GET", url, headers={"Range": f"bytes={start}-{wanted - 1}"}) as response:
            if response.status_code not in (200, 206):
                raise DownloadRefused(f"The Hub answered {response.status_code} for a file's header.")
            skip = start if response.status_code == 200 else 0
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) >= skip + length:
                    break
        if len(data) < skip + length:
            raise DownloadRefused("A safetensors file on the Hub is shorter than its header says.")
        return bytes(data[skip : skip + length])

    def _header(self, plan: Plan, file: RemoteFile) -> dict[str, Any]:
        url = self._url(plan, file.name)
        try:
            length = int.from_bytes(self._read_range(url, 0, 8), "little")
            if length <= 1 or length > min(MAX_HEADER_BYTES, file.size - 8):
                raise DownloadRefused(f"{plan.repo_id}: {file.name} has an implausible header length.")
            header = json.loads(self._read_range(url, 8, length))
        except httpx.HTTPError as error:
            raise DownloadRefused(f"The Hub could not be reached for {plan.repo_id}: {error}") from None
        except ValueError:
            raise DownloadRefused(f"{plan.repo_id}: {file.name}'s header is not valid JSON.") from None
        if not isinstance(header, dict):
            raise DownloadRefused(f"{plan.repo_id}: {file.name}'s header is not a table.")
        try:
            ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
            end = max(ends, default=0)
            header_bytes(header)
        except (KeyError, IndexError, TypeError, ValueError):
            raise DownloadRefused(f"{plan.repo_id}: {file.name}'s header does not describe tensors.") from None
        if not isinstance(end, int) or 8 + length + end != file.size:
            raise DownloadRefused(
                f"{plan.repo_id}: {file.name} is listed as {file.size} bytes, but its header "
                f"describes {8 + length + end if isinstance(end, int) else 'other'} bytes."
            )
        return header

    # -- the download -------------------------------------------------------------------

    def fetch(self, plan: Plan, progress: Progress) -> Path:
        """Download ``plan``'s files into the cache; returns the snapshot folder.

        ``progress(done, total)`` is called as bytes arrive (from this thread).
        """
        repo = repo_folder(plan.repo_id, self.hf_home)
        snapshots = repo / "snapshots"
        snapshot = snapshots / plan.commit
        total = plan.total
        if not snapshot.is_dir():
            staging = snapshots / f".{plan.commit}.{uuid.uuid4().hex}.partial"
            staging.mkdir(parents=True)
            try:
                done = 0
                progress(0, total)
                for file in plan.files:
                    done = self._fetch_file(plan, file, staging, done, total, progress)
                try:
                    os.replace(staging, snapshot)
                except OSError:
                    if not snapshot.is_dir():
                        raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        if plan.revision != plan.commit:
            ref = repo / "refs" / plan.revision
            self._inside(repo, ref)
            ref.parent.mkdir(parents=True, exist_ok=True)
            partial = ref.with_name(ref.name + ".partial")
            partial.write_text(plan.commit)
            os.replace(partial, ref)
        (repo / MARKER).touch()
        progress(total, total)
        return snapshot

    def _fetch_file(self, plan: Plan, file: RemoteFile, staging: Path, done: int, total: int,
                    progress: Progress) -> int:
        parts = plain_path(file.name)
        assert parts is not None  # plan() kept only plain names
        target = staging.joinpath(*parts)
        self._inside(staging, target)
        target.parent.mkdir(parents=True, exist_ok=True)
        received = 0
        try:
            with self._client.stream("GET", self._url(plan, file.name)) as response:
                if response.status_code != 200:
                    raise DownloadRefused(
                        f"The Hub answered {response.status_code} for {plan.repo_id}'s {file.name}."
                    )
                with open(target, "xb") as out:
                    for chunk in response.iter_bytes(_CHUNK):
                        if self.stopping.is_set():
                            raise DownloadRefused("The server is stopping; ask again once it is back.")
                        received += len(chunk)
                        if received > file.size:
                            break
                        out.write(chunk)
                        progress(done + received, total)
        except httpx.HTTPError as error:
            raise DownloadRefused(f"Downloading {plan.repo_id}'s {file.name} failed: {error}") from None
        if received != file.size:
            raise DownloadRefused(
                f"{plan.repo_id}'s {file.name} was listed as {format_size(file.size)} but "
                f"{'more' if received > file.size else format_size(received)} arrived."
            )
        if file.name in plan.headers and self._local_header(target) != plan.headers[file.name]:
            raise DownloadRefused(
                f"{plan.repo_id}'s {file.name} changed on the Hub while it was downloaded; ask again."
            )
        return done + received

    @staticmethod
    def _local_header(path: Path) -> Any:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            return json.loads(handle.read(length))

    def _inside(self, root: Path, path: Path) -> None:
        """Refuse (loudly: it is a bug or an attack) a path that leaves ``root`` or the cache."""
        real, base = path.resolve(), root.resolve()
        if not real.is_relative_to(base) or not real.is_relative_to(self.cache.resolve()):
            raise DownloadRefused(f"refused to write {path}: outside the model cache")

    # -- the disk -------------------------------------------------------------------------

    def fetched(self) -> dict[str, tuple[int, float]]:
        """Repos this module fetched: repo id -> (bytes on disk, last use as a timestamp)."""
        found: dict[str, tuple[int, float]] = {}
        if not self.cache.is_dir():
            return found
        for folder in self.cache.glob("models--*"):
            marker = folder / MARKER
            if not marker.is_file():
                continue
            repo_id = folder.name.removeprefix("models--").replace("--", "/")
            # A download in progress (a hidden staging folder) is reserved by its caller instead.
            size = sum(
                p.lstat().st_size for p in folder.rglob("*")
                if p.is_file() and not p.is_symlink()
                and not any(part.startswith(".") for part in p.relative_to(folder).parts[:-1])
            )
            found[repo_id] = (size, marker.stat().st_mtime)
        return found

    def touch(self, repo_id: str) -> None:
        """Note that a fetched repo was used (least recently used goes first)."""
        marker = repo_folder(repo_id, self.hf_home) / MARKER
        if marker.is_file():
            marker.touch()

    def delete(self, repo_id: str) -> None:
        """Delete a repo this module fetched (never one it did not: no marker, no deletion)."""
        folder = repo_folder(repo_id, self.hf_home)
        if not valid_repo_id(repo_id) or not (folder / MARKER).is_file():
            return
        self._inside(self.cache, folder)
        shutil.rmtree(folder)

"""A read-only Hugging Face Hub mirror of the models this server hosts.

Why it exists: the unmodified nnsight client, before it sends anything to us,
talks to the Hugging Face Hub. Building ``LanguageModel("org/name")`` on the
meta device downloads the repo's config and tokenizer files, and minting the
remote model key (``to_model_key``) asks the Hub for the repo's info to
canonicalise its id. On a network with no internet those requests fail, so the
client cannot even describe the model it wants to run. The server already holds
every file the client needs, in the Hugging Face cache layout (see
`nnhost.models.hfcache`), so it answers those requests itself: a user points
``HF_ENDPOINT`` at ``http://host:port/hub`` and the client works unchanged.

Only the handful of Hub routes the client libraries use are implemented, with
the response shapes and headers `huggingface_hub` relies on:

* ``GET /api/models/{repo_id}`` and ``GET /api/models/{repo_id}/revision/{rev}``:
  the model info (``id``, ``sha``, ``siblings``, ``pipeline_tag``, ...);
* ``GET /api/models/{repo_id}/tree/{rev}[/{path}]``: a folder listing;
* ``HEAD``/``GET /{repo_id}/resolve/{rev}/{filename}``: a file, with the
  ``X-Repo-Commit`` and ``ETag`` headers the download code insists on;
* ``GET /api/agent-harnesses``: an empty registry (`huggingface_hub` fetches
  it once a day to build its user agent; empty is a valid answer).

Errors carry the ``X-Error-Code`` header (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``) that `huggingface_hub` turns into its
typed exceptions; an optional file the client probes for is an
``EntryNotFound``, which it treats as "absent". Anything else is a 404 JSON.

What it must never do:

* never write: every route is a read, any other method or path is a 404;
* never serve a repo the server does not host: which repos and revisions
  exist is entirely the ``resolve`` callback's answer, and nothing outside the
  snapshot folder it returns is ever read. Paths with ``..`` or other odd
  segments are refused, and a symlink is followed only if it lands inside the
  snapshot or inside the ``blobs`` folder of the same cached repo (where the
  Hugging Face cache keeps the real files);
* never serve weights unless asked to (``serve_weights=True``): by default
  weight files are neither listed nor downloadable. The point is to let a
  client describe a model, not to hand out checkpoints to whoever can reach
  the server.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import logging
import os
import re
import stat
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

__all__ = ["create_hub_router", "WEIGHT_SUFFIXES", "is_weight_file"]

logger = logging.getLogger(__name__)

#: ``resolve(repo_id, revision)`` -> the snapshot folder, or None if not hosted.
Resolver = Callable[[str, Optional[str]], Optional[Path]]

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

_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def is_weight_file(path: str) -> bool:
    """Whether ``path`` (a repo-relative file name) is a weight file."""
    return path.lower().endswith(WEIGHT_SUFFIXES)


# --------------------------------------------------------------------------
# Validation of what the URL names
# --------------------------------------------------------------------------


def _valid_repo_id(repo_id: str) -> bool:
    parts = repo_id.split("/")
    if len(parts) not in (1, 2):
        return False
    return all(
        _REPO_PART.fullmatch(part) and ".." not in part and "--" not in part
        for part in parts
    )


def _valid_revision(revision: str) -> bool:
    """A commit or a ref name, with nothing that could walk out of a folder."""
    if not _REVISION_CHARS.fullmatch(revision):
        return False
    # Git's own rules forbid these too: empty components, components starting
    # with a dot (".", "..", hidden staging folders), "..", and ".lock".
    return all(
        part and not part.startswith(".") and not part.endswith(".lock")
        for part in revision.split("/")
    ) and ".." not in revision


def _split_relative(path: str) -> Optional[list[str]]:
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


class _Snapshot:
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
        parts = _split_relative(rel)
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


class _FileIds:
    """Hashes of served files, computed once per (path, size, mtime)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple, dict] = {}

    @staticmethod
    def is_lfs(rel: str, size: int) -> bool:
        return is_weight_file(rel) or size >= LFS_THRESHOLD

    def describe(self, rel: str, real: Path) -> dict:
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
            info = {
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


# --------------------------------------------------------------------------
# Model info
# --------------------------------------------------------------------------

# Architecture-class suffix -> the Hub's pipeline tag.
_ARCH_PIPELINES: tuple[tuple[str, str], ...] = (
    ("ForCausalLM", "text-generation"),
    ("LMHeadModel", "text-generation"),
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMaskedLM", "fill-mask"),
)
_PIPELINE_AUTO = {
    "text-generation": "AutoModelForCausalLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "fill-mask": "AutoModelForMaskedLM",
}


def _read_json(path: Optional[Path]) -> dict:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _card_metadata(readme: Optional[Path]) -> dict:
    """``pipeline_tag``, ``library_name`` and ``tags`` from a model card's header."""
    if readme is None:
        return {}
    try:
        text = readme.read_text(encoding="utf-8", errors="replace")[:20000]
    except OSError:
        return {}
    match = re.match(r"---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not match:
        return {}
    found: dict = {}
    lines = match.group(1).splitlines()
    for index, line in enumerate(lines):
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip().strip("'\"")
        if key in ("pipeline_tag", "library_name") and value and not line.startswith(" "):
            found[key] = value
        elif key == "tags" and not line.startswith(" "):
            tags = []
            for item in lines[index + 1 :]:
                if not item.lstrip().startswith("- "):
                    break
                tags.append(item.strip()[2:].strip().strip("'\""))
            found["tags"] = [t for t in tags if t]
    return found


def _pipeline_tag(config: dict) -> Optional[str]:
    explicit = config.get("pipeline_tag")
    if isinstance(explicit, str) and explicit:
        return explicit
    architectures = config.get("architectures") or []
    for arch in architectures if isinstance(architectures, list) else []:
        for suffix, tag in _ARCH_PIPELINES:
            if isinstance(arch, str) and arch.endswith(suffix):
                return tag
    return None


def _safetensors_parameters(paths: list[Path]) -> Optional[dict]:
    """Parameter counts by dtype, read from safetensors headers (no weights read)."""
    counts: dict[str, int] = {}
    for path in paths:
        try:
            with open(path, "rb") as handle:
                length = int.from_bytes(handle.read(8), "little")
                if length <= 0 or length > 100 * 1024 * 1024:
                    return None
                header = json.loads(handle.read(length))
        except (OSError, ValueError):
            return None
        try:
            for name, tensor in header.items():
                if name == "__metadata__" or not isinstance(tensor, dict):
                    continue
                count = 1
                for dim in tensor.get("shape", []):
                    count *= int(dim)
                dtype = str(tensor.get("dtype", "UNKNOWN"))
                counts[dtype] = counts.get(dtype, 0) + count
        except (AttributeError, TypeError, ValueError):
            return None
    if not counts:
        return None
    return {"parameters": counts, "total": sum(counts.values())}


def _iso(moment: _dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _model_info(snap: _Snapshot, ids: _FileIds, blobs: bool) -> dict:
    files = list(snap.files())
    by_name = dict(files)
    config = _read_json(by_name.get("config.json"))
    card = _card_metadata(by_name.get("README.md"))
    pipeline = card.get("pipeline_tag") or _pipeline_tag(config)
    library = card.get("library_name") or ("transformers" if config else None)
    model_type = config.get("model_type")

    # Counting parameters reads only the safetensors headers, never the
    # weights, so it is reported whether or not the weights are served.
    weights = [real for rel, real in snap.files(include_weights=True)]
    safetensors = _safetensors_parameters(
        [p for p in weights if p.name.endswith(".safetensors")]
    )

    tags = list(card.get("tags") or [])
    for tag in (
        library,
        "safetensors" if safetensors else None,
        model_type,
        pipeline,
    ):
        if isinstance(tag, str) and tag and tag not in tags:
            tags.append(tag)

    siblings = []
    for rel, real in files:
        sibling: dict = {"rfilename": rel}
        if blobs:
            described = ids.describe(rel, real)
            sibling["size"] = described["size"]
            sibling["blobId"] = described["oid"]
            if described["lfs"]:
                lfs = described["lfs"]
                sibling["lfs"] = {
                    "size": lfs["size"],
                    "sha256": lfs["oid"],
                    "pointerSize": lfs["pointerSize"],
                }
        siblings.append(sibling)

    modified = _iso(snap.last_modified())
    namespace = snap.repo_id.split("/")[0] if "/" in snap.repo_id else None
    info: dict = {
        "_id": hashlib.sha1(snap.repo_id.encode()).hexdigest()[:24],
        "id": snap.repo_id,
        "modelId": snap.repo_id,
        "author": namespace,
        "sha": snap.sha,
        "lastModified": modified,
        "createdAt": modified,
        "private": False,
        "gated": False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": tags,
        "pipeline_tag": pipeline,
        "library_name": library,
        "siblings": siblings,
        "spaces": [],
        "usedStorage": sum(real.stat().st_size for _, real in files),
    }
    if config:
        summary: dict = {}
        for key in ("architectures", "model_type"):
            if key in config:
                summary[key] = config[key]
        tokenizer_config = _read_json(by_name.get("tokenizer_config.json"))
        special = {
            key: value
            for key, value in tokenizer_config.items()
            if key.endswith("_token") and isinstance(value, str)
        }
        if special:
            summary["tokenizer_config"] = special
        info["config"] = summary
        auto = _PIPELINE_AUTO.get(pipeline or "")
        if auto:
            info["transformersInfo"] = {
                "auto_model": auto,
                "pipeline_tag": pipeline,
                "processor": "AutoTokenizer" if tokenizer_config else None,
            }
    if safetensors:
        info["safetensors"] = safetensors
    return info


def _tree(snap: _Snapshot, ids: _FileIds, path: str, recursive: bool, expand: bool) -> list:
    """The Hub's tree listing of folder ``path`` ("" = the root)."""
    if path:
        parts = _split_relative(path)
        if parts is None:
            return []
        prefix = "/".join(parts) + "/"
    else:
        prefix = ""
    entries: list[dict] = []
    folders: dict[str, list[str]] = {}
    for rel, real in snap.files():
        if not rel.startswith(prefix):
            continue
        rest = rel[len(prefix) :].split("/")
        # Every folder between the listed one and the file.
        for depth in range(1, len(rest)):
            folder = prefix + "/".join(rest[:depth])
            if depth == 1 or recursive:
                folders.setdefault(folder, []).append(rel)
        if len(rest) > 1 and not recursive:
            continue
        described = ids.describe(rel, real)
        entry: dict = {
            "type": "file",
            "oid": described["oid"],
            "size": described["size"],
            "path": rel,
        }
        if described["lfs"]:
            entry["lfs"] = dict(described["lfs"])
        entries.append(entry)
    for folder, members in folders.items():
        oid = hashlib.sha1(("\0".join(sorted(members))).encode()).hexdigest()
        entries.append({"type": "directory", "oid": oid, "size": 0, "path": folder})
    if expand:
        commit = {"id": snap.sha, "title": "Hosted by nnhost", "date": _iso(snap.last_modified())}
        for entry in entries:
            entry["lastCommit"] = commit
    entries.sort(key=lambda e: (e["type"] != "directory", e["path"]))
    return entries


# --------------------------------------------------------------------------
# Errors, in the form huggingface_hub maps to its exception types
# --------------------------------------------------------------------------


def _header_text(text: str) -> str:
    """``text`` made safe for a header: ASCII, no control characters, bounded."""
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:300]


def _error(code: Optional[str], message: str, status: int = 404, commit: Optional[str] = None) -> JSONResponse:
    # The message may echo a name from the URL: the body is JSON-escaped, the
    # header is made plain ASCII so no name can break (or inject) headers.
    headers = {"X-Error-Message": _header_text(message)}
    if code:
        headers["X-Error-Code"] = code
    if commit:
        headers["X-Repo-Commit"] = commit
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _not_found() -> JSONResponse:
    return _error(None, "Not found on this Hub mirror.")


def _guarded(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """``handler``, answering a JSON 404 (no error code) if it fails unexpectedly.

    No error code on purpose: `huggingface_hub` then reports an error rather
    than reading it as "optional file absent". The details go to the log only.
    """

    @functools.wraps(handler)
    def wrapper(request: Request) -> Response:
        try:
            return handler(request)
        except Exception:  # noqa: BLE001 - never a 500 (or a traceback) to clients
            logger.exception("hub mirror failed on %s", request.url.path)
            return _error(None, "This Hub mirror could not read the requested resource.")

    return wrapper


# --------------------------------------------------------------------------
# The router
# --------------------------------------------------------------------------


def create_hub_router(
    resolve: Resolver,
    *,
    serve_weights: bool = False,
) -> APIRouter:
    """A router answering the Hub requests of `huggingface_hub` for hosted repos.

    ``resolve(repo_id, revision)`` returns the local snapshot folder of a hosted
    repo at ``revision`` (a ref such as ``"main"`` or a 40-hex commit; ``None``
    means the default revision), or None when the repo is not hosted or the
    revision is unknown. It is the only authority on what exists: this router
    never reads outside the folders it returns. Weight files are hidden unless
    ``serve_weights``.

    The paths are relative; mount it under a prefix, e.g.
    ``app.include_router(create_hub_router(...), prefix="/hub")``, and give
    clients ``HF_ENDPOINT=http://host:port/hub``.
    """
    router = APIRouter()
    ids = _FileIds()

    def lookup(
        repo_id: str, revision: Optional[str]
    ) -> tuple[Optional[_Snapshot], Optional[Response]]:
        """The snapshot, or the error response saying why there is none."""
        if not _valid_repo_id(repo_id):
            return None, _error("RepoNotFound", f"Repository {repo_id!r} not found.")
        revision = revision or "main"
        snapshot = resolve(repo_id, revision) if _valid_revision(revision) else None
        if snapshot is not None and Path(snapshot).is_dir():
            return _Snapshot(repo_id, Path(snapshot), serve_weights), None
        # Told apart only to give the client the right error: is the repo
        # hosted at all (at its default revision)?
        if resolve(repo_id, None) is None:
            return None, _error("RepoNotFound", f"Repository {repo_id!r} not found.")
        return None, _error(
            "RevisionNotFound", f"Invalid rev id: {revision} for {repo_id}."
        )

    def repo_of(request: Request) -> str:
        params = request.path_params
        return f"{params['org']}/{params['name']}" if "org" in params else params["name"]

    # ----- model info ---------------------------------------------------
    def info(request: Request, revision: Optional[str]) -> Response:
        snap, error = lookup(repo_of(request), revision)
        if error is not None:
            return error
        blobs = request.query_params.get("blobs", "").lower() in ("1", "true")
        return JSONResponse(_model_info(snap, ids, blobs))

    def model_info(request: Request) -> Response:
        return info(request, None)

    def model_info_at(request: Request) -> Response:
        return info(request, request.path_params["revision"])

    # ----- tree ---------------------------------------------------------
    def tree(request: Request) -> Response:
        snap, error = lookup(repo_of(request), request.path_params["revision"])
        if error is not None:
            return error
        query = request.query_params
        flag = lambda name: query.get(name, "").lower() in ("1", "true")  # noqa: E731
        path = request.path_params.get("path", "")
        return JSONResponse(_tree(snap, ids, path, flag("recursive"), flag("expand")))

    # ----- files --------------------------------------------------------
    def resolve_file(request: Request) -> Response:
        snap, error = lookup(repo_of(request), request.path_params["revision"])
        if error is not None:
            return error
        filename = request.path_params["filename"]
        real = snap.file(filename)
        if real is None:
            return _error(
                "EntryNotFound", f"{filename} does not exist on {snap.sha}.", commit=snap.sha
            )
        described = ids.describe(filename, real)
        headers = {
            "X-Repo-Commit": snap.sha,
            "ETag": f'"{described["etag"]}"',
            "Cache-Control": "no-cache",
        }
        if described["lfs"]:
            headers["X-Linked-Etag"] = f'"{described["etag"]}"'
            headers["X-Linked-Size"] = str(described["size"])
        media_type = None
        if filename.endswith((".json", ".jinja", ".txt", ".md")):
            media_type = "application/json" if filename.endswith(".json") else "text/plain; charset=utf-8"
        return FileResponse(real, headers=headers, media_type=media_type)

    # ----- registration: two-part ids first, then legacy one-part ids -----
    model_info, model_info_at, tree, resolve_file = map(
        _guarded, (model_info, model_info_at, tree, resolve_file)
    )
    for repo in ("{org}/{name}", "{name}"):
        router.add_api_route(f"/api/models/{repo}", model_info, methods=["GET"])
        router.add_api_route(
            f"/api/models/{repo}/revision/{{revision:path}}", model_info_at, methods=["GET"]
        )
        router.add_api_route(f"/api/models/{repo}/tree/{{revision}}", tree, methods=["GET"])
        router.add_api_route(
            f"/api/models/{repo}/tree/{{revision}}/{{path:path}}", tree, methods=["GET"]
        )
        router.add_api_route(
            f"/{repo}/resolve/{{revision}}/{{filename:path}}",
            resolve_file,
            methods=["GET", "HEAD"],
        )

    # huggingface_hub builds its user agent from this registry (once a day);
    # an empty one is a valid answer and spares a 404 on every client start.
    def agent_harnesses() -> Response:
        return JSONResponse({"standardEnvVars": [], "harnesses": {}})

    router.add_api_route("/api/agent-harnesses", agent_harnesses, methods=["GET"])

    def anything_else(request: Request) -> Response:
        return _not_found()

    router.add_api_route(
        "/{rest:path}", anything_else, methods=_ALL_METHODS, include_in_schema=False
    )
    return router

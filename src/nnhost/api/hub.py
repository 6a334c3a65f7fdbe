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

The mirror is three rooms: this module is its HTTP side (the routes, the
status codes, headers and error codes); `nnhost.api.hub_files` decides which
files a snapshot exposes, where they really live and what the Hub calls them
(blob ids, ETags); `nnhost.api.hub_info` builds the model-info and tree
bodies. The rules below hold for all three.

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

import functools
import logging
from pathlib import Path
from typing import Callable, Optional

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from . import hub_info
from .hub_files import (
    WEIGHT_SUFFIXES,
    FileIds,
    Snapshot,
    is_weight_file,
    valid_repo_id,
    valid_revision,
)

__all__ = ["create_hub_router", "WEIGHT_SUFFIXES", "is_weight_file"]

logger = logging.getLogger(__name__)

#: ``resolve(repo_id, revision)`` -> the snapshot folder, or None if not hosted.
Resolver = Callable[[str, Optional[str]], Optional[Path]]

_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


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
    ids = FileIds()

    def lookup(
        repo_id: str, revision: Optional[str]
    ) -> tuple[Optional[Snapshot], Optional[Response]]:
        """The snapshot, or the error response saying why there is none."""
        if not valid_repo_id(repo_id):
            return None, _error("RepoNotFound", f"Repository {repo_id!r} not found.")
        revision = revision or "main"
        snapshot = resolve(repo_id, revision) if valid_revision(revision) else None
        if snapshot is not None and Path(snapshot).is_dir():
            return Snapshot(repo_id, Path(snapshot), serve_weights), None
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
        assert snap is not None  # lookup gives a snapshot or an error
        blobs = request.query_params.get("blobs", "").lower() in ("1", "true")
        return JSONResponse(hub_info.model_info(snap, ids, blobs))

    def model_info(request: Request) -> Response:
        return info(request, None)

    def model_info_at(request: Request) -> Response:
        return info(request, request.path_params["revision"])

    # ----- tree ---------------------------------------------------------
    def tree(request: Request) -> Response:
        snap, error = lookup(repo_of(request), request.path_params["revision"])
        if error is not None:
            return error
        assert snap is not None  # lookup gives a snapshot or an error
        query = request.query_params
        flag: Callable[[str], bool] = lambda name: query.get(name, "").lower() in ("1", "true")  # noqa: E731
        path = request.path_params.get("path", "")
        return JSONResponse(hub_info.tree(snap, ids, path, flag("recursive"), flag("expand")))

    # ----- files --------------------------------------------------------
    def resolve_file(request: Request) -> Response:
        snap, error = lookup(repo_of(request), request.path_params["revision"])
        if error is not None:
            return error
        assert snap is not None  # lookup gives a snapshot or an error
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
    guarded_info, guarded_info_at, guarded_tree, guarded_file = map(
        _guarded, (model_info, model_info_at, tree, resolve_file)
    )
    for repo in ("{org}/{name}", "{name}"):
        router.add_api_route(f"/api/models/{repo}", guarded_info, methods=["GET"])
        router.add_api_route(
            f"/api/models/{repo}/revision/{{revision:path}}", guarded_info_at, methods=["GET"]
        )
        router.add_api_route(f"/api/models/{repo}/tree/{{revision}}", guarded_tree, methods=["GET"])
        router.add_api_route(
            f"/api/models/{repo}/tree/{{revision}}/{{path:path}}", guarded_tree, methods=["GET"]
        )
        router.add_api_route(
            f"/{repo}/resolve/{{revision}}/{{filename:path}}",
            guarded_file,
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

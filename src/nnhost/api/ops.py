"""Service endpoints: /status, /env, /whoami, /ping, /metrics.

``nnsight.status()`` and ``is_model_running()`` read /status, ``nnsight.compare()``
reads /env, ``nnsight login`` / ``whoami`` read /whoami. ``/metrics`` is for
Prometheus: it holds no user's data, but its histograms move one job at a
time, so by default it needs a key tagged admin or metrics (``metrics_access``).
"""

from __future__ import annotations

import sys
from functools import lru_cache
from importlib.metadata import distributions, packages_distributions
from typing import Any, Optional

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import PlainTextResponse, Response

from ..auth.access import Throttled
from ..client_versions import runtime_for
from ..runtimes import site_packages
from ..storage.blocking import run_blocking
from ..telemetry.metrics import CONTENT_TYPE_LATEST
from .deps import API_KEY_HEADER, client_address, server_of, too_many

router = APIRouter()


@lru_cache(maxsize=None)
def installed_packages(runtime: str = "") -> dict[str, str]:
    """Installed distributions keyed by the name one imports them by (``runtime``'s, if named).

    Only installed distributions: modules that merely sit on the server's path
    are the server's own business and are not listed. A runtime (`nnhost.runtimes`)
    is the server's environment with its own few distributions (its nnsight) first.
    """
    imports_of: dict[str, list[str]] = {}
    for import_name, dist_names in packages_distributions().items():
        if import_name.startswith("_"):
            continue
        for dist_name in dist_names:
            imports_of.setdefault(dist_name, []).append(import_name)
    packages: dict[str, str] = {}
    found = list(distributions())
    if runtime:
        found += list(distributions(path=[str(site_packages(runtime))]))  # the runtime's win
    for dist in found:
        name = dist.metadata["Name"]
        if not name:
            continue
        for import_name in imports_of.get(name) or [name]:
            packages[import_name] = dist.version
    return dict(sorted(packages.items()))


@router.get("/ping", response_class=PlainTextResponse)
async def ping() -> str:
    return "pong"


@router.get("/status")
async def status(request: Request) -> dict[str, Any]:
    server = server_of(request)
    board = server.jobs.board()
    status = board.model_dump(include={"deployments", "devices"})
    # Which nnsight clients are served, each with its own version's code.
    status["client_versions"] = list(server.settings.client_versions)
    if board.nodes is not None:
        # On a cluster: memory per node (controller.nodes).
        status["nodes"] = board.model_dump(include={"nodes"})["nodes"]
    if board.stale:
        # No controller has reported lately (API processes without one): say so.
        status["controller"] = {"reporting": False,
                                "last_report_seconds_ago": board.published_seconds_ago}
    return status


@router.get("/env")
async def env(request: Request) -> dict[str, Any]:
    """The environment jobs run in: the runtime of the version an ``nnsight-version`` header
    names, the server's own otherwise (the 0.8 clients' ``compare()`` sends none)."""
    sent = request.headers.get("nnsight-version", "").strip()
    runtime = runtime_for(sent, server_of(request).settings.client_versions) if sent else ""
    return {"python_version": sys.version, "packages": installed_packages(runtime)}


@router.get("/whoami")
async def whoami(request: Request) -> dict[str, Any]:
    # Counted like any other key check, so /whoami is no faster an oracle than /request.
    try:
        check = await run_blocking(
            server_of(request).access.authenticate,
            request.headers.get(API_KEY_HEADER),
            client_address(request),
        )
    except Throttled as error:
        raise too_many(error) from None
    principal = check.principal
    if principal is None:
        return {"email": None, "tags": []}
    return {"email": principal.email, "tags": list(principal.tags)}


#: Tags whose keys may read /metrics when ``metrics_access = "key"``.
METRICS_TAGS = frozenset({"admin", "metrics"})


def metrics_key(request: Request) -> Optional[str]:
    """The key a scraper sent: ``ndif-api-key``, or ``Authorization: Bearer`` (Prometheus's way)."""
    key = request.headers.get(API_KEY_HEADER)
    if key:
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    server = server_of(request)
    if server.settings.metrics_access == "key":
        # Its histograms move by one job at a time: another user's result size,
        # hence input length, could be read off them. Operators only.
        try:
            check = await run_blocking(
                server.access.authenticate, metrics_key(request), client_address(request)
            )
        except Throttled as error:
            raise too_many(error) from None
        if check.principal is None:
            raise HTTPException(
                401,
                "/metrics needs a key tagged admin or metrics, sent as `ndif-api-key` or "
                "`Authorization: Bearer <key>` (or set metrics_access = \"public\").",
            )
        if not METRICS_TAGS & set(check.principal.tags):
            raise HTTPException(403, "/metrics is for keys tagged admin or metrics; yours is not.")
    # On the event loop, like every change to what it reads: one consistent moment.
    body = server.metrics.exposition()
    return Response(body, media_type=CONTENT_TYPE_LATEST)

"""The public status page at ``/`` and the JSON it keeps itself current from.

``GET /api/overview`` says, for anyone (like ``/status``, no key and no user's
data): the service's state, and per model its level, state, replicas, queue,
running jobs, the last hour's median wait and run time, its containment
layers and what it is doing; and jobs per minute over the last hour. The page
is rendered from the same dictionary, so it reads right before its script has
run, and ``status.js`` refreshes it every few seconds without a reload. The
JSON ``/status`` the nnsight client reads is a different route and unchanged.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..replicas.contract import ReplicaStatus
from .deps import server_of
from .pages import render, viewer_of

if TYPE_CHECKING:
    from .server import Server

router = APIRouter(include_in_schema=False)

#: When this process started serving, for the page's uptime.
STARTED = time.time()


def overview(server: Server) -> dict[str, Any]:
    """The controller's board (`controller.board`), with the service's state and this page's clock."""
    board = server.jobs.board()
    if board.draining:
        state = "draining"
    elif board.stale or any(m.state == ReplicaStatus.UNHEALTHY for m in board.models):
        state = "degraded"
    else:
        state = "serving"
    shown = board.model_dump(include={"models", "per_minute"})
    return {
        "service": {"state": state, "uptime_seconds": round(time.time() - STARTED, 1),
                    "models": len(board.models)},
        "models": shown["models"],
        "per_minute": shown["per_minute"],
        "generated_at": time.time(),
    }


@router.get("/api/overview")
async def overview_json(request: Request) -> dict[str, Any]:
    return overview(server_of(request))


@router.get("/")
async def status_page(request: Request) -> Response:
    data = overview(server_of(request))
    peak = max([1] + [b["completed"] + b["errors"] for b in data["per_minute"]])
    return render(request, "status.html", viewer=await viewer_of(request), active="status",
                  data=data, peak=peak)

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

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..deployments.contract import ReplicaStatus
from ..deployments.manager import Deployment
from .deps import server_of
from .pages import render, viewer_of

router = APIRouter(include_in_schema=False)

#: When this process started serving, for the page's uptime.
STARTED = time.time()


def _state(deployment: Deployment) -> ReplicaStatus:
    if deployment.unhealthy:
        return ReplicaStatus.UNHEALTHY
    if deployment.loading:
        return ReplicaStatus.DEPLOYING
    if deployment.healthy:
        return ReplicaStatus.RUNNING
    return ReplicaStatus.NOT_STARTED


def _containment(deployment: Deployment):
    for replica in deployment.replicas:
        report = replica.health().containment
        if report:
            return {
                "enabled": bool(report.get("enabled", True)),
                "mode": report.get("mode", ""),
                "active": list(report.get("active", [])),
                "unavailable": dict(report.get("unavailable", {})),
            }
    return None


def _description(deployment: Deployment) -> str:
    for replica in deployment.replicas:
        text = replica.health().description.strip()
        if text:
            return text.splitlines()[-1]
    return deployment.note


def overview(server) -> dict:
    recent = server.metrics.jobs.recent
    models = []
    for name, deployment in server.deployments.deployments.items():
        states = deployment.states()
        models.append({
            "name": name,
            "repo_id": deployment.spec.repo_id,
            "level": deployment.level,
            "target": deployment.target,
            "state": _state(deployment),
            "replicas": {"total": len(states), "running": states.count(ReplicaStatus.RUNNING),
                         "configured": deployment.count, "most": deployment.spec.most_replicas},
            "queued": server.scheduler.waiting(name),
            "running": sum(1 for replica in deployment.replicas if replica.busy),
            **recent.summary(name),
            "containment": _containment(deployment),
            "description": _description(deployment),
            "note": deployment.note,
        })
    if server.jobs.draining:
        state = "draining"
    elif any(m["state"] is ReplicaStatus.UNHEALTHY for m in models):
        state = "degraded"
    else:
        state = "serving"
    return {
        "service": {"state": state, "uptime_seconds": round(time.time() - STARTED, 1),
                    "models": len(models)},
        "models": models,
        "per_minute": recent.per_minute(),
        "generated_at": time.time(),
    }


@router.get("/api/overview")
async def overview_json(request: Request) -> dict:
    return overview(server_of(request))


@router.get("/")
async def status_page(request: Request) -> Response:
    data = overview(server_of(request))
    peak = max([1] + [b["completed"] + b["errors"] for b in data["per_minute"]])
    return render(request, "status.html", viewer=viewer_of(request), active="status",
                  data=data, peak=peak)

"""Operator endpoints: deploy, evict, list jobs; and cancelling a job.

Everything here except cancelling needs a key whose user is tagged ``admin``.
A user may cancel their own jobs; an admin may cancel anyone's. Another user's
job id is a 404, so ids reveal nothing.
"""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel

from ..auth.keys import Principal
from ..deployments.manager import COLD, HOT, WARM, CannotFit
from .deps import require_principal, server_of

router = APIRouter()


def require_admin(request: Request) -> Principal:
    principal = require_principal(request)
    if "admin" not in principal.tags:
        raise HTTPException(403, "This needs an operator's key (a user tagged 'admin').")
    return principal


class DeployBody(BaseModel):
    model: str
    level: str = "hot"


class EvictBody(BaseModel):
    model: str


def _deployment(server, name: str):
    if name not in server.deployments.deployments:
        served = ", ".join(server.deployments.deployments) or "none"
        raise HTTPException(404, f"No model {name!r} in this server's catalog. Catalog: {served}.")
    return server.deployments.get(name)


@router.post("/admin/deploy")
async def deploy(body: DeployBody, request: Request) -> dict:
    require_admin(request)
    return deploy_model(server_of(request), body.model, body.level)


def deploy_model(server, name: str, level: str) -> dict:
    """Bring ``name`` to ``level`` (hot or warm); HTTPException when it cannot be."""
    deployment = _deployment(server, name)
    level = level.upper()
    if level not in (HOT, WARM):
        raise HTTPException(422, "level must be 'hot' or 'warm'.")
    if level == WARM and deployment.target == HOT:
        # Asked for less than it has: demote, freeing its device, if it is idle.
        if deployment.busy or server.jobs.has_work(deployment.name):
            raise HTTPException(
                409, f"{deployment.name} has queued or running jobs; it stays HOT for now."
            )
        server.deployments.set_level(deployment.name, WARM, note="Made WARM by the operator.")
        return {"model": deployment.name, "target": WARM, "note": deployment.note}
    try:
        note = server.deployments.request(deployment.name, level)
    except CannotFit as error:
        raise HTTPException(409, str(error)) from None
    if deployment.target != level and not (level == WARM and deployment.target == HOT):
        raise HTTPException(409, f"{deployment.name} cannot be made {level} now: {note}.")
    return {"model": deployment.name, "target": deployment.target, "note": deployment.note}


@router.post("/admin/evict")
async def evict(body: EvictBody, request: Request) -> dict:
    require_admin(request)
    return evict_model(server_of(request), body.model)


def evict_model(server, name: str) -> dict:
    """Make ``name`` COLD; HTTPException when it has work."""
    deployment = _deployment(server, name)
    if deployment.busy or server.jobs.has_work(deployment.name):
        raise HTTPException(
            409,
            f"{deployment.name} has queued or running jobs and is not evicted; "
            "try again when its queue is empty.",
        )
    server.deployments.set_level(deployment.name, COLD, note="Evicted by the operator.")
    return {"model": deployment.name, "target": COLD}


@router.get("/admin/jobs")
async def list_jobs(
    request: Request, user: Optional[str] = None, model: Optional[str] = None, limit: int = 100
) -> dict:
    require_admin(request)
    server = server_of(request)
    user_id = None
    if user:
        owner = server.keys.user_by_email(user)
        if owner is None:
            raise HTTPException(404, f"No user {user!r}.")
        user_id = owner.user_id
    jobs = server.jobs.store.search(user_id=user_id, deployment=model, limit=min(limit, 10_000))
    return {
        "jobs": [
            {
                "id": job.id,
                "user_id": job.user_id,
                "model": job.deployment,
                "status": job.status.value,
                "description": job.description,
                "created_at": job.created_at,
                "updated_at": job.updated_at,
                "runtime": (job.meta or {}).get("runtime"),
            }
            for job in jobs
        ]
    }


@router.post("/jobs/{job_id}/cancel")
async def cancel(job_id: str, request: Request) -> dict:
    principal = require_principal(request)
    server = server_of(request)
    job = server.jobs.store.get(job_id)
    if job is None or (job.user_id != principal.user_id and "admin" not in principal.tags):
        raise HTTPException(404, f"No job {job_id} for this API key.")
    if not server.jobs.cancel(job):
        raise HTTPException(409, f"Job {job_id} has already ended ({job.status.value}).")
    return {"id": job_id, "cancelled": True}

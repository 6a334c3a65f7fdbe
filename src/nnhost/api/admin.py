"""Operator endpoints: deploy, evict, list jobs; and cancelling a job.

Everything here except cancelling needs a key whose user is tagged ``admin``.
A user may cancel their own jobs; an admin may cancel anyone's. Another user's
job id is a 404, so ids reveal nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, TypeVar

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ValidationError

from ..auth.keys import Principal
from ..jobs.messages import Refused
from ..storage.blocking import run_blocking
from .deps import BodyTooLarge, bounded, require_principal, server_of, validation_problems

if TYPE_CHECKING:
    from .server import Server

router = APIRouter()


async def require_admin(request: Request) -> Principal:
    principal = await require_principal(request)
    if "admin" not in principal.tags:
        raise HTTPException(403, "This needs an operator's key (a user tagged 'admin').")
    return principal


class DeployBody(BaseModel):
    model: str
    level: str = "hot"


class EvictBody(BaseModel):
    model: str


#: Largest JSON body an operator route reads (a model name and a level).
_MAX_JSON_BYTES = 64 * 1024

Body = TypeVar("Body", bound=BaseModel)


async def read_json(request: Request, model: type[Body]) -> Body:
    """The route's JSON body, read only now (after the key was checked) and bounded."""
    try:
        raw = await bounded(request, _MAX_JSON_BYTES).body()
    except BodyTooLarge:
        raise HTTPException(413, f"This route takes a JSON body of at most {_MAX_JSON_BYTES:,} bytes.") from None
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise HTTPException(422, f"The JSON body is not valid: {validation_problems(error, 'body')}") from None


@router.post("/admin/deploy")
async def deploy(request: Request) -> dict[str, Any]:
    # The key first, the body after: nobody's body is read before they are known.
    await require_admin(request)
    body = await read_json(request, DeployBody)
    return await deploy_model(server_of(request), body.model, body.level)


async def deploy_model(server: Server, name: str, level: str) -> dict[str, Any]:
    """Bring ``name`` to ``level`` (hot or warm); HTTPException when it cannot be."""
    return await _ask(server, "deploy", model=name, level=level)


@router.post("/admin/evict")
async def evict(request: Request) -> dict[str, Any]:
    await require_admin(request)
    body = await read_json(request, EvictBody)
    return await evict_model(server_of(request), body.model)


async def evict_model(server: Server, name: str) -> dict[str, Any]:
    """Make ``name`` COLD; HTTPException when it has work."""
    return await _ask(server, "evict", model=name)


async def _ask(server: Server, kind: str, **args: str) -> dict[str, Any]:
    try:
        return await server.jobs.command(kind, **args)
    except Refused as refusal:
        raise HTTPException(refusal.code, refusal.detail) from None


@router.get("/admin/jobs")
async def list_jobs(
    request: Request, user: Optional[str] = None, model: Optional[str] = None, limit: int = 100
) -> dict[str, Any]:
    await require_admin(request)
    server = server_of(request)
    user_id = None
    if user:
        owner = await run_blocking(server.keys.user_by_email, user)
        if owner is None:
            raise HTTPException(404, f"No user {user!r}.")
        user_id = owner.user_id
    jobs = await server.jobs.search(user_id=user_id, deployment=model, limit=min(limit, 10_000))
    return {
        "jobs": [
            {
                "id": job.id,
                "user_id": job.user_id,
                "model": job.deployment,
                "status": job.status.value,
                "description": job.description,
                "created_at": job.created_at,
                "started_at": job.started_at,
                "updated_at": job.updated_at,
                "runtime": (job.meta or {}).get("runtime"),
            }
            for job in jobs
        ]
    }


@router.post("/jobs/{job_id}/cancel")
async def cancel(job_id: str, request: Request) -> dict[str, Any]:
    principal = await require_principal(request)
    server = server_of(request)
    job = await server.jobs.get(job_id)
    if job is None or (job.user_id != principal.user_id and "admin" not in principal.tags):
        raise HTTPException(404, f"No job {job_id} for this API key.")
    if not await server.jobs.cancel(job):
        raise HTTPException(409, f"Job {job_id} has already ended ({job.status.value}).")
    return {"id": job_id, "cancelled": True}

"""The operator's page at ``/admin``: what runs, what waits, what failed, and buttons.

For a web login whose user is tagged ``admin`` (anyone else gets a 403 page;
nobody gets a hint of what is on it). It lists running and queued jobs with
their owners, models and ages, each with a cancel button; every model with
deploy, make-WARM and evict buttons; and the most recent errors with their
job ids. The buttons are CSRF-protected forms that do exactly what the JSON
operator routes do (`admin.deploy_model`, `admin.evict_model`, the job
service's cancel), then come back here with a notice of what was done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from ..jobs.job import UNFINISHED, Job, Status
from ..storage.blocking import run_blocking
from .admin import deploy_model, evict_model
from .deps import server_of
from .pages import Viewer, message, read_form, redirect, render, to_login, viewer_of
from .status_page import overview

if TYPE_CHECKING:
    from .server import Server

router = APIRouter(include_in_schema=False)

#: What the notice after each button says.
DONE = {
    "cancel": "Cancelled job {target}.",
    "hot": "{target} is being made HOT.",
    "warm": "{target} is being made WARM.",
    "evict": "Evicted {target}.",
}
RECENT_ERRORS = 20


@dataclass(frozen=True)
class JobLine:
    job: Job
    owner: str
    age: float


async def _operator(request: Request) -> tuple[Optional[Viewer], Optional[Response]]:
    """(viewer, None) for an admin; (None, response) for anyone else."""
    viewer = await viewer_of(request)
    if viewer is None:
        return None, to_login(request)
    if "admin" not in viewer.principal.tags:
        return None, message(request, viewer, 403, "Operators only",
                             "This page is for operators (users tagged 'admin').")
    return viewer, None


async def _operator_form(request: Request) -> tuple[Optional[Viewer], Optional[Response]]:
    """(viewer, None) for an admin's button with a good CSRF token; (None, response) else."""
    viewer, refusal = await _operator(request)
    if refusal is None:
        _, refusal = await read_form(request, viewer)
    return (viewer, None) if refusal is None else (None, refusal)


def _lines(server: Server, jobs: list[Job]) -> list[JobLine]:
    """Blocking (it reads each owner from the key store): run it with `run_blocking`."""
    owners: dict[int, str] = {}
    now = time.time()
    lines = []
    for job in jobs:
        if job.user_id not in owners:
            user = server.keys.user(job.user_id)
            owners[job.user_id] = user.email if user is not None else f"user {job.user_id}"
        lines.append(JobLine(job, owners[job.user_id], max(0.0, now - job.created_at)))
    return lines


@router.get("/admin")
async def admin_page(request: Request, did: str = "", target: str = "") -> Response:
    viewer, refusal = await _operator(request)
    if refusal is not None:
        return refusal
    server = server_of(request)
    live = sorted(await server.jobs.with_status(UNFINISHED), key=lambda job: job.created_at)
    errors = await server.jobs.search(status=Status.ERROR, limit=RECENT_ERRORS)
    notice = DONE[did].format(target=target) if did in DONE and target else ""
    return render(
        request, "admin.html", viewer=viewer, active="admin", data=overview(server),
        live=await run_blocking(_lines, server, live),
        errors=await run_blocking(_lines, server, errors), notice=notice,
    )


@router.post("/admin/jobs/{job_id}/cancel")
async def cancel_from_page(job_id: str, request: Request) -> Response:
    viewer, refusal = await _operator_form(request)
    if refusal is not None:
        return refusal
    server = server_of(request)
    job = await server.jobs.get(job_id)
    if job is None:
        return message(request, viewer, 404, "Not found", f"There is no job {job_id}.")
    if not await server.jobs.cancel(job):
        return message(request, viewer, 409, "Already ended",
                       f"Job {job_id} had already ended ({job.status.value}).")
    return redirect("/admin?" + urlencode({"did": "cancel", "target": job_id}))


@router.post("/admin/models/{name:path}/{action}")
async def model_from_page(name: str, action: str, request: Request) -> Response:
    viewer, refusal = await _operator_form(request)
    if refusal is not None:
        return refusal
    server = server_of(request)
    try:
        if action in ("hot", "warm"):
            await deploy_model(server, name, action)
        elif action == "evict":
            await evict_model(server, name)
        else:
            return message(request, viewer, 404, "Not found", f"No action {action!r}.")
    except HTTPException as error:
        return message(request, viewer, error.status_code, "Not done", str(error.detail))
    return redirect("/admin?" + urlencode({"did": action, "target": name}))



"""What an operator or a user asks of the controller: deploy, evict, cancel.

The rules live here, on the controller's side, so that an API process in the
same process (``role = "all"``) and one on another machine (through
`relay.DatabaseLink`) get the same answers. A refusal is a `front.Refused`
carrying the HTTP status the API answers with; this module knows nothing of
HTTP beyond that number.
"""

from __future__ import annotations

from typing import Any, Callable

from ..deployments.contract import Level
from ..deployments.manager import COLD, HOT, WARM, CannotFit, Deployment
from .front import Refused
from .service import JobService


def _deployment(service: JobService, name: str) -> Deployment:
    deployments = service.deployments.deployments
    if not isinstance(name, str) or name not in deployments:
        served = ", ".join(deployments) or "none"
        raise Refused(404, f"No model {name!r} in this server's catalog. Catalog: {served}.")
    return deployments[name]


def deploy(service: JobService, model: str, level: str = "hot") -> dict[str, Any]:
    """Bring ``model`` to ``level`` (hot or warm)."""
    deployment = _deployment(service, model)
    asked = str(level).upper()
    if asked not in (HOT, WARM):
        raise Refused(422, "level must be 'hot' or 'warm'.")
    wanted = Level(asked)
    manager = service.deployments
    if wanted == WARM and deployment.target == HOT:
        # Asked for less than it has: demote, freeing its device, if it is idle.
        if deployment.busy or service.has_work(deployment.name):
            raise Refused(409, f"{deployment.name} has queued or running jobs; it stays HOT for now.")
        manager.set_level(deployment.name, WARM, note="Made WARM by the operator.")
        return {"model": deployment.name, "target": WARM, "note": deployment.note}
    try:
        note = manager.request(deployment.name, wanted)
    except CannotFit as error:
        raise Refused(409, str(error)) from None
    if deployment.target != wanted and not (wanted == WARM and deployment.target == HOT):
        raise Refused(409, f"{deployment.name} cannot be made {wanted} now: {note}.")
    return {"model": deployment.name, "target": deployment.target, "note": deployment.note}


def evict(service: JobService, model: str) -> dict[str, Any]:
    """Make ``model`` COLD, unless it has work."""
    deployment = _deployment(service, model)
    if deployment.busy or service.has_work(deployment.name):
        raise Refused(
            409,
            f"{deployment.name} has queued or running jobs and is not evicted; "
            "try again when its queue is empty.",
        )
    service.deployments.set_level(deployment.name, COLD, note="Evicted by the operator.")
    return {"model": deployment.name, "target": COLD}


def cancel(service: JobService, job_id: str) -> dict[str, Any]:
    job = service.store.get(job_id) if isinstance(job_id, str) else None
    if job is None:
        raise Refused(404, f"No job {job_id}.")
    if not service.cancel(job):
        raise Refused(409, f"Job {job_id} has already ended ({job.status.value}).")
    return {"id": job_id, "cancelled": True}


#: Each takes the service and the command's arguments by name (they come from a
#: request, so `carry_out` turns a mismatch into a refusal).
COMMANDS: dict[str, Callable[..., dict[str, Any]]] = {"deploy": deploy, "evict": evict, "cancel": cancel}


def carry_out(service: JobService, kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one command; `Refused` for a refusal, including an unknown or malformed command."""
    command = COMMANDS.get(kind)
    if command is None:
        raise Refused(400, f"Unknown command {kind!r}.")
    try:
        return command(service, **args)
    except TypeError:
        raise Refused(400, f"Malformed {kind} command: {sorted(args)}.") from None

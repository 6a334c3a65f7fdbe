"""What an operator or a user asks of the controller: deploy, evict, cancel.

The rules live here, on the controller's side, so that an API process in the
same process (``role = "all"``) and one on another machine (through
`front.database_link.DatabaseLink`) get the same answers. A refusal is a `messages.Refused`
carrying the HTTP status the API answers with; this module knows nothing of
HTTP beyond that number.

A command arrives as a `messages.Command`, already checked (`parse_command`),
and each answers with its declared result type: nothing here reads a
dictionary of arguments.
"""

from __future__ import annotations

from ..jobs.messages import Cancel, Cancelled, Command, Deploy, Deployed, Evict, Evicted, Refused, Result
from ..replicas.contract import Level
from ..storage.blocking import run_blocking
from .deployment import COLD, HOT, WARM, Deployment
from .manager import CannotFit
from .service import JobService


def _deployment(service: JobService, name: str) -> Deployment:
    deployments = service.deployments.deployments
    if name not in deployments:
        served = ", ".join(deployments) or "none"
        raise Refused(404, f"No model {name!r} in this server's catalog. Catalog: {served}.")
    return deployments[name]


def deploy(service: JobService, model: str, level: str = "hot") -> Deployed:
    """Bring ``model`` to ``level`` (hot or warm)."""
    deployment = _deployment(service, model)
    asked = level.upper()
    if asked not in (HOT, WARM):
        raise Refused(422, "level must be 'hot' or 'warm'.")
    wanted = Level(asked)
    manager = service.deployments
    if wanted == WARM and deployment.target == HOT:
        # Asked for less than it has: demote, freeing its device, if it is idle.
        if deployment.busy or service.has_work(deployment.name):
            raise Refused(409, f"{deployment.name} has queued or running jobs; it stays HOT for now.")
        manager.set_level(deployment.name, WARM, note="Made WARM by the operator.")
        return Deployed(model=deployment.name, target=str(WARM), note=deployment.note)
    try:
        note = manager.request(deployment.name, wanted)
    except CannotFit as error:
        raise Refused(409, str(error)) from None
    if deployment.target != wanted and not (wanted == WARM and deployment.target == HOT):
        raise Refused(409, f"{deployment.name} cannot be made {wanted} now: {note}.")
    return Deployed(model=deployment.name, target=str(deployment.target), note=deployment.note)


def evict(service: JobService, model: str) -> Evicted:
    """Make ``model`` COLD, unless it has work."""
    deployment = _deployment(service, model)
    if deployment.busy or service.has_work(deployment.name):
        raise Refused(
            409,
            f"{deployment.name} has queued or running jobs and is not evicted; "
            "try again when its queue is empty.",
        )
    service.deployments.set_level(deployment.name, COLD, note="Evicted by the operator.")
    return Evicted(model=deployment.name, target=str(COLD))


async def cancel(service: JobService, job_id: str) -> Cancelled:
    # The controller's own view first (newer than the row); else the row, off the loop.
    job = service.recorder.job(job_id) or await run_blocking(service.store.get, job_id)
    if job is None:
        raise Refused(404, f"No job {job_id}.")
    if not service.cancel(job):
        raise Refused(409, f"Job {job_id} has already ended ({job.status.value}).")
    return Cancelled(id=job_id, cancelled=True)


async def carry_out(service: JobService, command: Command) -> Result:
    """Run one command; `Refused` for a refusal."""
    if isinstance(command, Deploy):
        return deploy(service, command.model, command.level)
    if isinstance(command, Evict):
        return evict(service, command.model)
    if isinstance(command, Cancel):
        return await cancel(service, command.job_id)
    raise Refused(400, f"Unknown command {command!r}.")  # a new kind, not yet carried out

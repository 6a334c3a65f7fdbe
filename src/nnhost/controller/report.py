"""What ``/status`` says of each deployment: one entry per replica, as the nnsight client reads it.

``nnsight.status()`` and ``is_model_running()`` read these entries (their
keys are the client's); the job board (`controller.board`) adds queue lengths and
publishes them. Reading only: nothing here changes a deployment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..replicas.contract import ReplicaStatus
from .deployment import COLD

if TYPE_CHECKING:
    from .manager import DeploymentManager


def status_entries(manager: "DeploymentManager") -> dict[str, dict[str, Any]]:
    """``/status``'s ``deployments``: one entry per replica (one COLD entry when none)."""
    entries: dict[str, dict[str, Any]] = {}
    for deployment in manager.deployments.values():
        spec = deployment.spec
        base = {
            "deployment": deployment.name,
            "model_key": spec.model_key(),
            "repo_id": spec.repo_id,
            "revision": spec.revision or "main",
            "task": spec.task,
            "trust_remote_code": spec.trust_remote_code,
            "device": spec.device,
            "devices": spec.placement_devices(),
            "size_bytes": spec.size_bytes,
            "note": deployment.note,
        }
        if not deployment.replicas:
            entries[deployment.name] = {
                **base,
                "deployment_level": COLD,
                "application_state": ReplicaStatus.NOT_STARTED,
                "busy": False,
            }
            continue
        for replica in deployment.replicas:
            state = replica.health()
            level = deployment.target if state.state is ReplicaStatus.RUNNING else COLD
            entries[replica.name] = {
                **base,
                "deployment_level": level,
                "application_state": state.state,
                "description": state.description.strip().splitlines()[-1]
                if state.description.strip()
                else "",
                "busy": replica.running > 0,
                "pid": replica.pid,
                "containment": state.containment,
                "runtimes": state.runtimes,
            }
    return entries

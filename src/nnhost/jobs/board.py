"""What the controller reports: every model's state, queues and memory, as plain data.

One function makes the picture that ``/status``, the status page, the
operator page and ``/metrics``' state gauges all show, so they agree with each
other and look the same on every API process: with ``role = "all"`` it is
computed on each read; a separate controller publishes it to the database
(`relay.Relay`) about once a second and API processes read that. It is JSON
data (no objects), and holds nothing of any user's: no job ids, no emails.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..deployments.contract import ReplicaStatus
from ..deployments.manager import Deployment
from ..deployments.nodes import memory_report
from ..deployments.report import status_entries
from .service import JobService

#: Per model, what the recent-jobs history adds (median wait and run, counts).
Summaries = Callable[[str], dict[str, Any]]


def _state(deployment: Deployment) -> str:
    if deployment.unhealthy:
        return ReplicaStatus.UNHEALTHY.value
    if deployment.loading:
        return ReplicaStatus.DEPLOYING.value
    if deployment.healthy:
        return ReplicaStatus.RUNNING.value
    return ReplicaStatus.NOT_STARTED.value


def _containment(deployment: Deployment) -> Optional[dict[str, Any]]:
    for replica in deployment.replicas:
        report = replica.health().containment
        if report:
            return {
                "enabled": bool(report.get("enabled", True)),
                "mode": report.get("mode", ""),
                "execution": report.get("execution", ""),
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


def board(service: JobService, summaries: Optional[Summaries] = None,
          per_minute: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    manager, scheduler = service.deployments, service.scheduler
    models = []
    for name, deployment in manager.deployments.items():
        states = deployment.states()
        counts: dict[str, int] = {}
        for state in states:
            counts[state.value] = counts.get(state.value, 0) + 1
        models.append({
            "name": name,
            "repo_id": deployment.spec.repo_id,
            "level": str(deployment.level),
            "target": str(deployment.target),
            "state": _state(deployment),
            "replicas": {"total": len(states), "running": states.count(ReplicaStatus.RUNNING),
                         "configured": deployment.count, "most": deployment.spec.most_replicas,
                         "by_state": counts},
            "queued": scheduler.waiting(name),
            "running": sum(1 for replica in deployment.replicas if replica.busy),
            "incidents": {kind.value: count for kind, count in deployment.tally.counts().items()},
            **(summaries(name) if summaries else {}),
            "containment": _containment(deployment),
            "description": _description(deployment),
            "note": deployment.note,
        })
    status = status_entries(manager)
    for entry in status.values():
        entry["queued"] = scheduler.waiting(entry["deployment"])
    return {
        "draining": service.draining,
        "models": models,
        "deployments": status,
        # this machine's budgets; on a cluster the nodes' sum, and "nodes", each node's own
        **memory_report(manager),
        "per_minute": per_minute or [],
        "generated_at": time.time(),
    }

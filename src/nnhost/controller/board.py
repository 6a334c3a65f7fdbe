"""What the controller reports: every model's state, queues and memory, as one typed value.

One function makes the picture that ``/status``, the status page, the
operator page and ``/metrics``' state gauges all show, so they agree with each
other and look the same on every API process: with ``role = "all"`` it is
computed on each read; a separate controller publishes it to the database
(`relay.Relay`) about once a second and API processes read that.

`board` makes a `messages.Board`: the model declares every key and its
type, and checks each part as it is built, so what the links hand on
(`relay.InProcessLink`, `relay.Relay.publish`) is already a checked board;
only a published one, which another process wrote, is checked again when an
API process reads it. It must hold nothing of any user's: no job ids, no
emails.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..jobs.messages import Board, Containment, Device, Minute, ModelEntry, NodeRoom, Replicas, StatusEntry
from ..replicas.contract import ReplicaStatus
from .deployment import Deployment
from .nodes import memory_report
from .report import status_entries
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


def _containment(deployment: Deployment) -> Optional[Containment]:
    for replica in deployment.replicas:
        report = replica.health().containment
        if report:
            return Containment(
                enabled=bool(report.get("enabled", True)),
                mode=report.get("mode", ""),
                execution=report.get("execution", ""),
                active=list(report.get("active", [])),
                unavailable=dict(report.get("unavailable", {})),
            )
    return None


def _description(deployment: Deployment) -> str:
    for replica in deployment.replicas:
        text = replica.health().description.strip()
        if text:
            return text.splitlines()[-1]
    return deployment.note


def board(service: JobService, summaries: Optional[Summaries] = None,
          per_minute: Optional[list[dict[str, Any]]] = None) -> Board:
    """The controller's board now."""
    manager, scheduler = service.deployments, service.scheduler
    models = []
    for name, deployment in manager.deployments.items():
        states = deployment.states()
        counts: dict[str, int] = {}
        for state in states:
            counts[state.value] = counts.get(state.value, 0) + 1
        models.append(ModelEntry(
            name=name,
            repo_id=deployment.spec.repo_id,
            level=str(deployment.level),
            target=str(deployment.target),
            state=_state(deployment),
            replicas=Replicas(total=len(states), running=states.count(ReplicaStatus.RUNNING),
                              configured=deployment.count, most=deployment.spec.most_replicas,
                              by_state=counts),
            queued=scheduler.waiting(name),
            running=deployment.running,
            incidents={kind.value: count for kind, count in deployment.tally.counts().items()},
            **(summaries(name) if summaries else {}),
            containment=_containment(deployment),
            description=_description(deployment),
            note=deployment.note,
        ))
    entries = {name: StatusEntry(**entry, queued=scheduler.waiting(entry["deployment"]))
               for name, entry in status_entries(manager).items()}
    # this machine's budgets; on a cluster the nodes' sum, and "nodes", each node's own
    memory = memory_report(manager)
    nodes = memory.get("nodes")
    return Board(
        draining=service.draining,
        models=models,
        deployments=entries,
        devices={device: Device(**use) for device, use in memory["devices"].items()},
        nodes=None if nodes is None else {node: NodeRoom(**room) for node, room in nodes.items()},
        per_minute=[Minute(**minute) for minute in per_minute or []],
        generated_at=time.time(),
    )

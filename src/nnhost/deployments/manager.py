"""Which models are up, on which replicas, and in what state.

The manager owns one replica per catalog model, reports their levels and
states the way ``/status`` (and so ``nnsight.status()``) expects, and hands a
job to an idle replica when asked. Replica callbacks arrive on replica threads;
the manager moves them onto the event loop before anyone else sees them, so
everything above it is single-threaded.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..execution.events import JobEvent, JobSpec
from ..execution.worker import WorkerOptions
from .catalog import Catalog, ModelKey, ModelSpec
from .replica import LocalReplica, ReplicaState

OnJobEvent = Callable[[str, JobEvent], None]
OnReady = Callable[[str], None]


@dataclass
class Deployment:
    spec: ModelSpec
    replica: LocalReplica
    state: ReplicaState = field(default_factory=lambda: ReplicaState("NOT_STARTED"))
    last_used: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def level(self) -> str:
        # A worker that holds the weights is HOT; this machine keeps no WARM tier yet.
        return "HOT" if self.state.state == "RUNNING" else "COLD"

    @property
    def ready(self) -> bool:
        return self.state.state == "RUNNING" and not self.replica.busy


class DeploymentManager:
    def __init__(
        self,
        catalog: Catalog,
        *,
        loop: asyncio.AbstractEventLoop,
        on_job_event: OnJobEvent,
        on_ready: OnReady,
        worker_environ: dict,
        torch_threads: int = 0,
        kill_grace: float = 10.0,
    ) -> None:
        self.catalog = catalog
        self._loop = loop
        self._on_job_event = on_job_event
        self._on_ready = on_ready
        self.deployments: dict[str, Deployment] = {}
        for spec in catalog:
            options = WorkerOptions(
                model_key=spec.model_key(),
                load_kwargs=dict(spec.load_kwargs),
                torch_threads=torch_threads,
                environ=dict(worker_environ),
            )
            name = spec.name
            replica = LocalReplica(
                name,
                options,
                on_job_event=lambda event, name=name: self._hop(self._job_event, name, event),
                on_state=lambda state, name=name: self._hop(self._state, name, state),
                on_idle=lambda name=name: self._hop(self._on_ready, name),
                kill_grace=kill_grace,
            )
            self.deployments[name] = Deployment(spec, replica)

    def _hop(self, function: Callable, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(function, *args)
        except RuntimeError:
            pass  # the loop is closed: the server is shutting down

    def _job_event(self, name: str, event: JobEvent) -> None:
        self._on_job_event(name, event)

    def _state(self, name: str, state: ReplicaState) -> None:
        deployment = self.deployments[name]
        deployment.state = state
        if state.state == "RUNNING":
            self._on_ready(name)

    # -- lookups ---------------------------------------------------------------

    def match(self, key: ModelKey) -> Optional[Deployment]:
        spec = self.catalog.match(key)
        return self.deployments[spec.name] if spec else None

    def get(self, name: str) -> Deployment:
        return self.deployments[name]

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        for deployment in self.deployments.values():
            deployment.replica.start()

    def stop(self) -> None:
        for deployment in self.deployments.values():
            deployment.replica.stop()

    def submit(self, name: str, spec: JobSpec) -> None:
        deployment = self.deployments[name]
        deployment.last_used = time.time()
        deployment.replica.submit(spec)

    def cancel(self, name: str, job_id: str) -> bool:
        return self.deployments[name].replica.cancel(job_id)

    # -- reporting ---------------------------------------------------------------

    def status(self) -> dict:
        """``/status``'s ``deployments``: one entry per replica."""
        entries = {}
        for deployment in self.deployments.values():
            spec = deployment.spec
            entries[deployment.name] = {
                "model_key": spec.model_key(),
                "repo_id": spec.repo_id,
                "revision": spec.revision or "main",
                "task": spec.task,
                "trust_remote_code": spec.trust_remote_code,
                "deployment_level": deployment.level,
                "application_state": deployment.state.state,
                "description": deployment.state.description.strip().splitlines()[-1]
                if deployment.state.description.strip()
                else "",
                "weight_bytes": deployment.state.weight_bytes,
                "busy": deployment.replica.busy,
            }
        return entries

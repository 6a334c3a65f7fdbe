"""Which models are up, at what level, on which replicas: placement and hotswapping.

Levels, as ``/status`` reports them:

* HOT: replicas hold the weights on the model's device and take jobs;
* WARM: replicas hold the weights in host memory, not serving; becoming HOT
  is a move to the device, not a load (on a CPU model it is immediate);
* COLD: on disk only; no process.

Where replicas may go is the placement's to say (`placement.Placement`, given
at composition): this machine's device budgets (`placement.DeviceBudgets`),
or room per node when the replica factory places replicas on a cluster's
nodes (`nodes.NodeRoom`). A replica occupies its model's size (weights plus
a margin) where it is placed while HOT or being brought up, and in host
memory ("cpu") while WARM. When a model must become HOT and there is no
room, the placement demotes the least recently used deployments with no
queued or running work (`victims`); a deployment with work is never
demoted. If nothing can make room the model waits, and says why. The
manager asks the same questions whichever placement it holds.

Replica callbacks arrive on replica threads; the manager moves them onto the
event loop and hands them to the callbacks it was given (the controller's
inbox), so everything above it is single-threaded. It holds the levels and
replicas and carries out what its placement decides; it never decides which
job runs (that is the scheduler's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Optional

from ..execution.events import JobEvent, JobSpec
from ..execution.policy import WorkerOptions
from ..models.catalog import Catalog, ModelKey, ModelSpec
from ..models.sizing import jobs_per_replica, threads_per_job
from ..replicas.contract import Level, Replica, ReplicaFactory, ReplicaState, ReplicaStatus
from .deployment import COLD, HOT, WARM, Deployment, HasWork
from .placement import CannotFit as CannotFit  # raised here by the placement; callers catch it
from .placement import Placement
from .scaling import Scaling

log = logging.getLogger("nnhost.deployments")

OnJobEvent = Callable[[str, JobEvent], None]
OnChange = Callable[[str], None]

_RANK = {COLD: 0, WARM: 1, HOT: 2}


class DeploymentManager:
    def __init__(
        self,
        catalog: Catalog,
        *,
        loop: asyncio.AbstractEventLoop,
        on_job_event: OnJobEvent,
        on_change: OnChange,
        has_work: HasWork,
        worker_environ: dict[str, str],
        placement: Placement,
        replica_factory: ReplicaFactory,
        torch_threads: int = 0,
        jobs_at_once: int = 0,
        jobs_per_process: int = 1,
        kill_grace: float = 10.0,
        scale_down_after: float = 300.0,
    ) -> None:
        self.catalog = catalog
        self._make_replica = replica_factory
        self._loop = loop
        self._on_job_event = on_job_event
        self._on_change = on_change
        self._has_work = has_work
        self._environ = dict(worker_environ)
        self._jobs_at_once = jobs_at_once
        self._jobs_per_process = jobs_per_process
        self.deployments: dict[str, Deployment] = {spec.name: self._deployment(spec) for spec in catalog}
        self._torch_threads = threads_per_job(torch_threads, sum(
            d.spec.most_replicas * d.jobs_at_once for d in self.deployments.values()))
        self._kill_grace = kill_grace
        #: Where replicas may go and whom to demote for room: this machine's device
        #: budgets, or room per node when replicas land on a cluster's nodes.
        self.placement = placement
        #: Grows a deployment whose queue waited, shrinks one idle beyond its minimum.
        self.scaling = Scaling(
            self.deployments, make_replica=self._replica, retire=self._retire,
            fits_another=self._fits_another, has_work=has_work, scale_down_after=scale_down_after,
        )

    # -- callbacks from replica threads ------------------------------------------

    def _hop(self, function: Callable[..., object], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(function, *args)
        except RuntimeError:
            pass  # the loop is closed: the server is shutting down

    def _replica(self, deployment: Deployment, index: int, level: Level) -> Replica:
        spec = deployment.spec
        name = spec.name if spec.most_replicas == 1 else f"{spec.name}#{index + 1}"
        options = WorkerOptions(
            model_key=spec.model_key(),
            load_kwargs=spec.worker_load_kwargs(),
            torch_threads=self._torch_threads,
            jobs_at_once=deployment.jobs_at_once,
            jobs_per_process=self._jobs_per_process,
            environ=dict(self._environ),
            device=self._device_for(spec, level),
            home_device=spec.device,
        )
        made: list[Replica] = []
        replica = self._make_replica(
            name,
            options,
            on_job_event=lambda event: self._hop(self._on_job_event, spec.name, event),
            on_state=lambda state: self._replica_state(spec.name, state),
            on_idle=lambda: self._hop(self._idle, spec.name, made[0]),
            kill_grace=self._kill_grace,
            on_incident=deployment.tally.note,
            needs=spec.hot_shares(),
        )
        made.append(replica)
        return replica

    def _idle(self, name: str, replica: Replica) -> None:
        self.scaling.idle(replica)
        self._on_change(name)

    def _retire(self, replica: Replica) -> None:
        """Stop a replica off the loop (a stop waits for its process)."""
        self._loop.run_in_executor(None, replica.stop)

    def _replica_state(self, name: str, state: ReplicaState) -> None:
        # Called from the replica's side (a thread, or Ray's): an operator
        # reading the server's log must see why a model did not come up, not
        # only a deployment that never becomes ready.
        if state.state is ReplicaStatus.UNHEALTHY:
            log.error("a replica of %s is unhealthy: %s", name, state.description.strip()[-4000:])
        self._hop(self._on_change, name)

    @staticmethod
    def _device_for(spec: ModelSpec, level: Level) -> str:
        """The device a worker is told to hold its weights on.

        A model spread by ``device_map`` is placed by the loader; naming its first
        device (where the embeddings go) leaves that placement as it is.
        """
        if level != HOT:
            return "cpu"
        if spec.device_map is not None:
            return spec.placement_devices()[0]
        return spec.device

    # -- lookups -----------------------------------------------------------------

    def match(self, key: ModelKey) -> Optional[Deployment]:
        spec = self.catalog.match(key)
        return self.deployments[spec.name] if spec else None

    def get(self, name: str) -> Deployment:
        return self.deployments[name]

    def has_work(self, name: str) -> bool:
        """Whether jobs wait for ``name`` (the scheduler's answer)."""
        return self._has_work(name)

    def add(self, spec: ModelSpec, note: str = "") -> Deployment:
        """Take on a model fetched on demand (COLD until a job asks for it)."""
        self.catalog.add(spec)
        return self.deployments.setdefault(spec.name, self._deployment(spec, note))

    def _deployment(self, spec: ModelSpec, note: str = "") -> Deployment:
        return Deployment(spec, note=note, jobs_at_once=jobs_per_replica(self._jobs_at_once, spec.device))

    def remove(self, name: str) -> None:
        """Forget a COLD model fetched on demand (its files are being deleted)."""
        deployment = self.deployments.get(name)
        if deployment is not None and name in self.catalog.fetched and deployment.target == COLD:
            del self.deployments[name]
            self.catalog.remove(name)

    # -- memory (the placement decides; these are what it reads) ---------------------

    def used(self, device: str, excluding: Optional[Deployment] = None) -> int:
        """Bytes the deployments (but ``excluding``) hold on ``device`` at their targets."""
        return sum(
            deployment.shares().get(device, 0)
            for deployment in self.deployments.values()
            if deployment is not excluding
        )

    def victims(self, device: Optional[str], wanted: Deployment) -> list[Deployment]:
        """Deployments that may be demoted to make room on ``device`` (None: on any node the
        cluster places on), least recently used first."""
        candidates = [
            d
            for d in self.deployments.values()
            if d is not wanted
            and (device in d.shares() if device else d.target != COLD)
            and not d.busy
            and not d.loading
            and not self._has_work(d.name)
        ]
        return sorted(candidates, key=lambda d: d.last_used)

    def make_room(self, wanted: Deployment, level: Level) -> Optional[str]:
        """Demote idle deployments until ``wanted`` fits at ``level`` wherever it goes; None if
        it cannot yet. Returns a note of what was evicted (possibly empty)."""
        return self.placement.make_room(self, wanted, level)

    def short_device(self, wanted: Deployment, level: Level) -> Optional[str]:
        """Where ``wanted`` does not fit at ``level``, if anywhere (raises `CannotFit` when it
        never could)."""
        return self.placement.short_of(self, wanted, level)

    def _fits_another(self, deployment: Deployment) -> bool:
        """Whether one more replica of ``deployment`` fits beside what is placed."""
        return self.placement.fits_another(self, deployment)

    # -- levels ----------------------------------------------------------------------

    def request(self, name: str, level: Level = HOT) -> str:
        """Bring ``name`` to ``level`` if memory allows; returns what is happening, for users."""
        deployment = self.deployments[name]
        level = Level(level)
        if _RANK[deployment.target] >= _RANK[level] and not deployment.unhealthy:
            return deployment.note
        note = self.make_room(deployment, level)
        if note is None:
            deployment.note = self.placement.waiting_note(self, deployment, level)
            return deployment.note
        if deployment.unhealthy:
            deployment.failed_starts += 1
        self.set_level(name, level, note=f"Deploying {name}" + (f"; {note}" if note else ""))
        return deployment.note

    def set_level(self, name: str, level: Level, note: str = "") -> None:
        """Move ``name`` to ``level`` now (memory must already have been made)."""
        deployment = self.deployments[name]
        level = Level(level)
        previous = deployment.target
        deployment.note = note
        if level == COLD:
            replicas, deployment.replicas = deployment.replicas, []
            deployment.target = COLD
            for replica in replicas:
                self._loop.run_in_executor(None, replica.stop)
        elif previous == COLD or deployment.unhealthy:
            for replica in deployment.replicas:
                self._loop.run_in_executor(None, replica.stop)
            deployment.target = level
            deployment.replicas = [
                self._replica(deployment, i, level) for i in range(deployment.spec.replicas)
            ]
            waiting = self._has_work(name)
            for replica in deployment.replicas:
                replica.start(jobs_waiting=waiting)
        else:
            deployment.target = level
            device = self._device_for(deployment.spec, level)
            for replica in deployment.replicas:
                replica.place(device)
        self._hop(self._on_change, name)

    def start(self) -> None:
        """Bring each catalog model to its starting level, in catalog order, as memory allows."""
        for deployment in self.deployments.values():
            wanted = Level(deployment.spec.deploy.upper())
            if wanted == COLD:
                continue
            try:
                device = self.short_device(deployment, wanted)
            except CannotFit as error:
                device, deployment.note = "", f"Left COLD at start: {error}"
            if device is None:
                self.set_level(deployment.name, wanted, note=f"Deploying {deployment.name}")
            elif device:
                deployment.note = f"Left COLD at start: {device} budget is full."

    def stop(self) -> None:
        for deployment in self.deployments.values():
            for replica in deployment.replicas:
                replica.stop()

    def submit(self, name: str, spec: JobSpec, more_waiting: bool = False) -> None:
        deployment = self.deployments[name]
        replica = deployment.idle_replica()
        if replica is None:
            raise RuntimeError(f"no idle replica of {name}")
        deployment.last_used = time.time()
        self.scaling.busy(replica)
        replica.submit(spec, more_waiting)

    def grow(self, name: str, waiting: int) -> Optional[str]:
        """Start one more replica of ``name`` if jobs wait and it may and fits (`scaling`)."""
        return self.scaling.grow(name, waiting)

    def shrink(self, now: Optional[float] = None) -> list[str]:
        """Stop extra replicas idle long enough (`scaling`); their names."""
        return self.scaling.shrink(now)

    def cancel(self, name: str, job_id: str) -> bool:
        return any(replica.cancel(job_id) for replica in self.deployments[name].replicas)

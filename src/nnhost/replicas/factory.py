"""How this server's replicas are made: where they run, and what their processes start with.

The controller's deployment manager is given a `ReplicaFactory` and the
environment of every replica's processes; this module chooses them from the
settings, so that the manager never asks which kind of replica it makes. It
must never start a replica itself.
"""

from __future__ import annotations

from ..config import Settings
from ..execution.policy import policy_from_settings
from ..models.catalog import Catalog
from ..models.hfcache import find_snapshot
from .contract import ReplicaFactory
from .replica import LocalReplica


def replica_factory(settings: Settings) -> ReplicaFactory:
    """Processes on this machine by default; Ray actors where Ray places them with ``cluster``."""
    if not settings.cluster:
        return LocalReplica
    from .ray_replica import RayReplicas  # Ray is imported only by a cluster's servers

    return RayReplicas(settings.cluster)


def worker_environ(settings: Settings, catalog: Catalog) -> dict[str, str]:
    """Environment for worker processes: the model cache, and offline when it can be."""
    environ = {"HF_HOME": str(settings.hf_home)}
    cached = all(
        find_snapshot(spec.repo_id, spec.revision, settings.hf_home) is not None for spec in catalog
    )
    if cached:
        # Every model is on disk: don't let the loaders reach for the network.
        environ["HF_HUB_OFFLINE"] = "1"
    # What user code may do in the workers (import allowlist, containment layers).
    environ.update(policy_from_settings(settings).to_environ())
    return environ

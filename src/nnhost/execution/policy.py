"""The worker's security policy: what the operator configured, as the worker needs it.

The API process builds a `WorkerPolicy` from its settings and hands it to each
worker process through one environment variable (JSON), which the worker reads
and removes before anything else runs. Keeping it to plain values means the
execution side needs no knowledge of the server's configuration.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, MutableMapping, Optional

from .os_layer.containment_policy import ContainmentPolicy
from .python_layer.sandbox import SandboxPolicy
from .python_layer.sandbox_rules import DEFAULT_ALLOWED_IMPORTS

ENVIRONMENT_KEY = "NNHOST_WORKER_POLICY"


class Design(str, enum.Enum):
    """How a replica runs its jobs (the ``execution`` setting, resolved for one device)."""

    #: Each job in a fresh process forked from the host, which holds the weights (CPU only).
    FORK = "fork"
    #: Each job in a fresh process forked from a template that never holds the
    #: weights; the job maps the host's weights by handle (`template`).
    MAPPED = "mapped"
    #: The host runs every job itself (trusted mode; accelerators until the
    #: mapped design maps their memory), behind the integrity guard.
    IN_PROCESS = "in-process"


@dataclass
class WorkerPolicy:
    #: The operator switch: False runs user code unconfined (trusted deployments).
    containment: bool = True
    allowed_imports: list[str] = field(default_factory=lambda: list(DEFAULT_ALLOWED_IMPORTS))
    limits: ContainmentPolicy = field(default_factory=ContainmentPolicy)
    #: Tests only: a job process runs a payload's raw Python prefix unrestricted
    #: (see `job.process._run_test_hook`). Set by the operator, never by a request.
    test_hooks: bool = False
    #: The operator's choice of design: "auto", "fork" or "mapped" (see `design`).
    execution: str = "auto"
    #: Host processes kept prepared for the next cold start (`replicas.spare_hosts`);
    #: read by the replica, which starts them.
    spare_hosts: int = 0
    #: Seconds a replica waits for a job process it asked for to say it is ready.
    job_start_timeout: float = 120.0
    #: nnsight version -> the Python of its runtime (`nnhost.runtimes`): a job of a
    #: client of that version runs in a template the replica starts with it.
    runtimes: dict[str, str] = field(default_factory=dict)
    #: Seconds a runtime other than the host's own may go without a job before its
    #: template stops (the next job of that version starts it again); 0: never.
    runtime_idle: float = 600.0

    def design(self, device: str) -> Design:
        """The design for a model whose home is ``device``.

        ``auto`` is fork on the CPU and in-process on accelerators: the mapped
        design's device handles (`cuda_handles`) have passed their check on a
        GPU, but the whole design has not yet served a job on one, so an
        accelerator gets it only when the operator asks for ``mapped``.
        """
        if not self.containment:
            return Design.IN_PROCESS
        if self.execution == Design.MAPPED.value and (device == "cpu" or device.startswith("cuda")):
            return Design.MAPPED
        return Design.FORK if device == "cpu" else Design.IN_PROCESS

    def __post_init__(self) -> None:
        if isinstance(self.limits, dict):
            self.limits = ContainmentPolicy(**self.limits)
        self.limits.enabled = self.containment

    @property
    def sandbox(self) -> SandboxPolicy:
        return SandboxPolicy.from_names(self.allowed_imports, enabled=self.containment)

    def to_environ(self) -> dict[str, str]:
        return {ENVIRONMENT_KEY: json.dumps(asdict(self))}

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str]) -> "WorkerPolicy":
        """The policy the server sent (removed from ``environ``); the safe default if none."""
        text: Optional[str] = environ.pop(ENVIRONMENT_KEY, None)
        if not text:
            return cls()
        data: Any = json.loads(text)
        return cls(**data)


def policy_from_settings(settings: Any) -> WorkerPolicy:
    """Build the policy from the server's settings (duck-typed: execution knows no Settings)."""
    data_dir = str(getattr(settings, "data_dir", "") or "")
    hide = [data_dir] if data_dir else []
    hf_home = getattr(settings, "hf_home", None)
    if hf_home:
        hide.append(str(hf_home))
    results_dir = getattr(settings, "results_dir", None)
    if results_dir and not str(results_dir).startswith(data_dir + os.sep):
        hide.append(str(results_dir))  # every user's results, kept outside the data dir
    hide.extend(str(path) for path in getattr(settings, "hidden_paths", []) or [])
    limits = ContainmentPolicy(
        hide=hide,
        scratch_bytes=int(getattr(settings, "scratch_bytes", 0) or ContainmentPolicy.scratch_bytes),
        memory_bytes=int(getattr(settings, "job_memory_bytes", 0) or 0),
        max_file_bytes=int(getattr(settings, "max_result_bytes", 0) or 0),
        uid_base=int(getattr(settings, "worker_uid_base", 0) or ContainmentPolicy.uid_base),
    )
    return WorkerPolicy(
        containment=bool(getattr(settings, "containment", True)),
        allowed_imports=list(getattr(settings, "allowed_imports", None) or DEFAULT_ALLOWED_IMPORTS),
        limits=limits,
        test_hooks=bool(getattr(settings, "unsafe_test_hooks", False)),
        execution=str(getattr(settings, "execution", "auto") or "auto"),
        spare_hosts=int(getattr(settings, "spare_hosts", 0) or 0),
        job_start_timeout=float(getattr(settings, "job_start_timeout", 0) or WorkerPolicy.job_start_timeout),
        runtimes=runtime_interpreters(getattr(settings, "client_versions", None) or []),
        runtime_idle=float(getattr(settings, "runtime_idle_seconds", WorkerPolicy.runtime_idle)),
    )


def runtime_interpreters(versions: list[str]) -> dict[str, str]:
    """The Python of each served version's runtime, all but the server's own nnsight's."""
    from ..client_versions import own_version
    from ..runtimes import interpreter

    own = own_version()
    return {name: str(interpreter(name)) for name in versions if name != own}


def pop_policy() -> WorkerPolicy:
    return WorkerPolicy.from_environ(os.environ)


@dataclass
class WorkerOptions:
    """How a replica process loads its model (JSON-native, crosses a process boundary)."""

    model_key: str
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    torch_threads: int = 0
    #: Jobs its replica runs at once, each in its own process (the fork and
    #: mapped designs; one process for every job runs one at a time).
    jobs_at_once: int = 1
    #: Jobs of one user one job process may run, one after another, before it
    #: exits (1: a fresh process for every job).
    jobs_per_process: int = 1
    #: Environment overrides applied before anything is imported.
    environ: dict[str, str] = field(default_factory=dict)
    #: Where the weights live once loaded: the model's device when HOT, "cpu" when WARM.
    device: str = "cpu"
    #: The model's device when HOT: a contained CPU model gets a fresh process per job.
    home_device: str = "cpu"

"""Loading a replica's model and making it safe to serve (used by `host`).

The host process (`host`) calls `load_model` and `secure` once; nothing here
runs user code. It knows nothing of HTTP or the database.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from .containment import ContainmentReport
    from .integrity import ModelGuard
    from .policy import WorkerPolicy
    from .runner import Runner


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


def load_model(options: WorkerOptions) -> Any:
    """Rebuild the nnsight wrapper from its model key, load weights, freeze them.

    Parameters are frozen so that gradients are opt-in per request: a user
    enables them on an activation with ``requires_grad = True``.
    """
    from .nnsight_api import current

    model = current().from_model_key(options.model_key, dispatch=True, **options.load_kwargs)
    for parameter in model._module.parameters():
        parameter.requires_grad_(False)
    model._module.eval()
    place(model, options.device)
    return model


def place(model: Any, device: str) -> None:
    """Move the weights to ``device`` (HOT on an accelerator, or back to host memory: WARM)."""
    current = next(model._module.parameters()).device
    if str(current) != device:
        model._module.to(device)


def weight_bytes(model: Any) -> int:
    module = model._module
    total: int = sum(p.nelement() * p.element_size() for p in module.parameters())
    total += sum(b.nelement() * b.element_size() for b in module.buffers())
    return total


#: Exit status of a worker whose job changed the model beyond repair (see `serve`).
EXIT_MODEL_CHANGED = 4


def crash_hint(exitcode: Optional[int]) -> str:
    """What a worker's exit status says to the user whose job was running."""
    import signal

    if exitcode in (-signal.SIGSEGV, -signal.SIGBUS):
        return (
            " Your request crashed it, for example by writing into the model's weights, "
            "which are read-only on this server: work on a copy (`weight.clone()`) or "
            "change activations instead."
        )
    if exitcode == EXIT_MODEL_CHANGED:
        return " Your request changed the shared model in a way that could not be undone."
    if exitcode == -signal.SIGKILL:
        return " It may have run out of memory."
    return ""


def die_with_parent() -> None:
    """Have the kernel kill this process when the API process dies, even by SIGKILL.

    Otherwise an orphaned worker could finish a job nobody will record, and the
    restarted server would run it again.
    """
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the pipe's EOF still ends the worker after its job
    if os.getppid() == 1:
        sys.exit(0)  # the parent died before we could ask


def python_layer(model: Any, policy: WorkerPolicy) -> Runner:
    """The runner with the Python layer: the restricted unpickler, the allowed
    libraries imported and hardened, the guarded builtins. No OS layer, no guard."""
    from .integrity import guard_module_attributes
    from .library_hardening import harden_libraries
    from .runner import Runner
    from .unpickling import restricted_unpickler

    sandbox = policy.sandbox
    unpickler = restricted_unpickler(sandbox)
    for name in sandbox.allowed_imports:
        try:  # imported now, so their namespaces are in the guard's snapshot
            __import__(name)
        except Exception:
            pass
    harden_libraries(sandbox, unpickler.builtins_dict)
    guard_module_attributes(unpickler.builtins_dict)
    return Runner(model, unpickler=unpickler)


def secure(
    model: Any, policy: WorkerPolicy, namespaces_problem: Optional[str], fork_mode: bool = False
) -> tuple[Runner, Optional[ModelGuard], ContainmentReport]:
    """Everything between loading the model and serving the first stranger.

    The runner reads payloads with the restricted unpickler and runs them with
    the guarded builtins; the guard snapshots the model (moving the CPU weights
    into read-only memory); then the OS-level layers shut the process in. With
    ``containment`` off (a trusted deployment) the runner is the plain one.

    In fork mode (``fork_mode``: each job in a fresh process forked from this
    one) there is no guard: nothing a job changes outlives its process. The
    weights are sealed all the same, so that a job cannot write them through
    the shared mapping, and the layers that are per job are left to each job's
    process (`job_layers`).
    """
    from .containment import contain
    from .runner import Runner

    if not policy.containment:
        report = contain(policy.limits, namespaces_problem)
        print(f"nnhost worker {os.getpid()}: {report.describe()}", file=sys.stderr, flush=True)
        return Runner(model), None, report
    from .integrity import ModelGuard

    runner = python_layer(model, policy)
    guard = None
    if fork_mode:
        from .weights import WeightImage

        # Its descriptor is kept where other runtimes' templates may map the same
        # weights (`mapped_weights.export`, asked for by the replica).
        runner.weight_image = WeightImage.build(list(model._module.parameters()), keep_fd=bool(policy.runtimes))
    else:
        guard = ModelGuard(model, runner.persistent_objects)
        runner.guard = guard
    off_host = sum(
        t.nelement() * t.element_size()
        for t in list(model._module.parameters()) + list(model._module.buffers())
        if t.device.type != "cpu"
    )
    report = contain(policy.limits, namespaces_problem, reserve_bytes=off_host, host_only=fork_mode)
    print(f"nnhost worker {os.getpid()}: {report.describe()}", file=sys.stderr, flush=True)
    return runner, guard, report


#: The warm-up's request (the server's own, never a user's), serialized for this process's model.
_own_request: Optional[bytes] = None


def warm_up(model: Any, runner: Runner) -> Optional[str]:
    """Run one request of our own through the whole job path, in the host, before any fork.

    Every job process starts as a copy of the host: whatever the host has
    already done once (imports done lazily, nnsight's compiled tracing code,
    torch's dispatch caches, the unpickler's and the serializer's first use)
    each job process inherits done, instead of paying for it on every request.
    It runs with one torch thread (see `host`). Returns why it failed, or None.
    """
    import os

    from .events import JobEvent, JobSpec
    from .nnsight_api import current

    global _own_request
    try:
        if _own_request is None:
            # Traced and serialized once, by the process that forks: every job
            # process inherits it and warms up on the run alone.
            _own_request = current().own_request(model, "Hello, world. The city of")
        payload = os.memfd_create("warm-up-payload", os.MFD_CLOEXEC)
        result = os.memfd_create("warm-up-result", os.MFD_CLOEXEC)
        os.write(payload, _own_request)
        os.lseek(payload, 0, os.SEEK_SET)
        events: list[JobEvent] = []
        runner.run(JobSpec("warm-up", "", True, payload_fd=payload, result_fd=result), events.append)
        final = events[-1] if events else None
        if final is None or final.status != "COMPLETED":
            return final.description if final is not None else "no final event"
        return None
    except Exception as error:  # a model whose forward needs other inputs: no warm-up
        return f"{type(error).__name__}: {error}"

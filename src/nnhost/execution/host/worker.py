"""Loading a replica's model and making it safe to serve (used by `host`).

The host process (`host`) calls `load_model` and `secure` once; nothing here
runs user code. It knows nothing of HTTP or the database.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ..guard.integrity import ModelGuard
    from ..job.runner import Runner
    from ..os_layer.containment import ContainmentReport
    from ..policy import WorkerOptions, WorkerPolicy


def load_model(options: WorkerOptions) -> Any:
    """Rebuild the nnsight wrapper from its model key, load weights, freeze them.

    Parameters are frozen so that gradients are opt-in per request: a user
    enables them on an activation with ``requires_grad = True``.
    """
    from ..nnsight_api import current

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


def python_layer(model: Any, policy: WorkerPolicy) -> Runner:
    """The runner with the Python layer: the restricted unpickler, the allowed
    libraries imported and hardened, the guarded builtins. No OS layer, no guard."""
    from ..guard.integrity import guard_module_attributes
    from ..job.runner import Runner
    from ..python_layer.library_hardening import harden_libraries
    from ..unpickling.unpickler import restricted_unpickler

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
    from ..job.runner import Runner
    from ..os_layer.containment import contain

    if not policy.containment:
        report = contain(policy.limits, namespaces_problem)
        print(f"nnhost worker {os.getpid()}: {report.describe()}", file=sys.stderr, flush=True)
        return Runner(model), None, report
    from ..guard.integrity import ModelGuard

    runner = python_layer(model, policy)
    guard = None
    if fork_mode:
        from ..weights.cpu import WeightImage

        # Its descriptor is kept where other runtimes' templates may map the same
        # weights (`weights.mapped.export`, asked for by the replica).
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

"""The replica process: load one model once, then run jobs one at a time.

This is the process that runs untrusted user code, so it is kept apart from the
API process: it talks to its parent over one duplex pipe and nothing else. It
receives ``("run", JobSpec)`` and ``("stop", None)`` and answers with
``("state", ...)``, ``("event", JobEvent)`` and ``("idle", job_id)``.

It knows nothing of HTTP or the database, and never decides anything about
scheduling: it loads, runs what it is given, and reports.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

from .events import JobEvent, JobSpec
from .handoff import receive_files


@dataclass
class WorkerOptions:
    """How a replica process loads its model (JSON-native, crosses a process boundary)."""

    model_key: str
    load_kwargs: dict = field(default_factory=dict)
    torch_threads: int = 0
    #: Environment overrides applied before anything is imported.
    environ: dict = field(default_factory=dict)
    #: Where the weights live once loaded: the model's device when HOT, "cpu" when WARM.
    device: str = "cpu"


def load_model(options: WorkerOptions) -> Any:
    """Rebuild the nnsight wrapper from its model key, load weights, freeze them.

    Parameters are frozen so that gradients are opt-in per request: a user
    enables them on an activation with ``requires_grad = True``.
    """
    from nnsight.modeling.mixins.remotable import Remotable

    model = Remotable.from_model_key(options.model_key, dispatch=True, **options.load_kwargs)
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
    total = sum(p.nelement() * p.element_size() for p in module.parameters())
    return total + sum(b.nelement() * b.element_size() for b in module.buffers())


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


def serve(connection: Any, options_json: str) -> None:
    """Entry point of the replica process (spawned by `LocalReplica`)."""
    options = WorkerOptions(**json.loads(options_json))
    die_with_parent()
    # A terminal's Ctrl-C or a service manager's SIGTERM reaches the whole
    # process group; the API process decides when its workers stop (after
    # letting running jobs finish), so the workers do not act on them.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.environ.update(options.environ)
    from .policy import pop_policy

    policy = pop_policy()
    # First, while this process still has one thread: its own mount namespace
    # (nothing changes in it until the model is loaded; see `containment`).
    namespaces_problem = None
    if policy.containment:
        from .containment import enter_private_namespaces

        namespaces_problem = enter_private_namespaces()
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # Libraries make multiprocessing locks at import (tqdm). Under the
        # "spawn" default this process inherited, each lock is a named
        # semaphore watched by a resource-tracker process started outside the
        # containment; under "fork" it is unlinked at once and no tracker runs.
        import multiprocessing

        multiprocessing.set_start_method("fork", force=True)
        # And the pipe to the server's own tracker (root, unconfined) is closed,
        # so user code cannot ask it to unlink anything.
        try:
            from multiprocessing import resource_tracker

            tracker = resource_tracker._resource_tracker
            if getattr(tracker, "_fd", None) is not None:
                os.close(tracker._fd)
                tracker._fd, tracker._pid = None, None
        except (ImportError, AttributeError, OSError):
            pass
    containment: dict = {}

    def send(kind: str, payload: Any) -> None:
        if kind == "state" and containment:
            payload = {**payload, "containment": containment}
        connection.send((kind, payload))

    send("state", {"state": "DEPLOYING", "description": "Loading the model."})
    try:
        import torch

        if options.torch_threads > 0:
            torch.set_num_threads(options.torch_threads)
        started = time.perf_counter()
        model = load_model(options)
        runner, guard, report = secure(model, policy, namespaces_problem)
        containment.update(report.to_dict())
    except BaseException:
        send("state", {"state": "UNHEALTHY", "description": traceback.format_exc()})
        connection.close()
        sys.exit(3)
    send(
        "state",
        {
            "state": "RUNNING",
            "description": f"Loaded in {time.perf_counter() - started:.1f}s; {report.describe()}.",
            "weight_bytes": weight_bytes(model),
        },
    )

    while True:
        try:
            kind, payload = connection.recv()
        except (EOFError, OSError):
            return  # the parent went away; nothing left to serve
        if kind == "stop":
            return
        if kind == "place":
            place(model, payload)
            if guard is not None:
                guard.rebaseline()
            send("state", {"state": "RUNNING", "description": f"Weights on {payload}."})
            continue
        if kind != "run":
            continue
        payload_fd, result_fd = receive_files(connection, payload)
        spec = JobSpec(**payload)
        spec.payload_fd, spec.result_fd = payload_fd, result_fd
        intact = runner.run(spec, lambda event: send("event", event.to_dict()))
        if not intact:
            # The job changed the model in a way that cannot be undone: exit,
            # and the replica starts a fresh worker from the checkpoint.
            connection.close()
            sys.exit(EXIT_MODEL_CHANGED)
        send("idle", spec.job_id)


def secure(model: Any, policy: Any, namespaces_problem: Optional[str]) -> tuple:
    """Everything between loading the model and serving the first stranger.

    The runner reads payloads with the restricted unpickler and runs them with
    the guarded builtins; the guard snapshots the model (moving the CPU weights
    into read-only memory); then the OS-level layers shut the process in. With
    ``containment`` off (a trusted deployment) the runner is the plain one.
    """
    from .containment import contain
    from .runner import Runner

    if not policy.containment:
        report = contain(policy.limits, namespaces_problem)
        print(f"nnhost worker {os.getpid()}: {report.describe()}", file=sys.stderr, flush=True)
        return Runner(model), None, report
    from .integrity import ModelGuard, guard_module_attributes
    from .sandbox import harden_libraries
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
    runner = Runner(model, unpickler=unpickler)
    guard = ModelGuard(model, runner.persistent_objects)
    runner.guard = guard
    off_host = sum(
        t.nelement() * t.element_size()
        for t in list(model._module.parameters()) + list(model._module.buffers())
        if t.device.type != "cpu"
    )
    report = contain(policy.limits, namespaces_problem, reserve_bytes=off_host)
    print(f"nnhost worker {os.getpid()}: {report.describe()}", file=sys.stderr, flush=True)
    return runner, guard, report

"""Process-wide state a job can change: torch's and numpy's settings, child processes.

Where one process serves many jobs, `ModelGuard` (`integrity`) snapshots this
state with the model and puts it back after each job (`process_state`,
`restore_process_state`), and stops the child processes a job started
(`stop_children`). With a process per job nothing needs restoring:
`shared_state` only lets the final message say what the job changed.

It must never touch the model or a job's results, and never let one job's
random state show through to the next: each job starts from fresh seeds
(`fresh_random_state`), so no user can replay or steer another's sampling.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .report import GuardReport


def process_state(random: bool = True) -> dict[str, Any]:
    """torch's and numpy's process-wide settings; their random states too unless ``random`` is False."""
    import torch

    state: dict[str, Any] = {
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "torch threads": torch.get_num_threads(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "matmul precision": torch.get_float32_matmul_precision(),
        "anomaly detection": torch.is_anomaly_enabled(),
    }
    if not random:
        return state
    state["torch random state"] = torch.get_rng_state()
    try:
        import numpy

        state["numpy random state"] = numpy.random.get_state()
    except ImportError:
        pass
    return state


def restore_process_state(state: dict[str, Any], report: GuardReport) -> None:
    import torch

    now = process_state()
    setters: dict[str, Callable[[Any], object]] = {
        "default dtype": torch.set_default_dtype,
        "grad mode": torch.set_grad_enabled,
        "torch threads": torch.set_num_threads,
        "deterministic algorithms": torch.use_deterministic_algorithms,
        "matmul precision": torch.set_float32_matmul_precision,
        "anomaly detection": torch.autograd.set_detect_anomaly,
    }
    for name, setter in setters.items():
        if now[name] != state[name]:
            setter(state[name])
            report.restored.append(f"torch {name}")
    # Random states are put back silently; the next job reseeds anyway.
    torch.set_rng_state(state["torch random state"])
    if "numpy random state" in state:
        import numpy

        numpy.random.set_state(state["numpy random state"])


def fresh_random_state() -> None:
    """Seed torch (every device), numpy and ``random`` from the OS's entropy.

    Every job's process starts from its parent's random state; without this,
    two users' sampled generations would be the same, and one could replay
    the other's. A user who wants a reproducible run seeds it in the request,
    after this.
    """
    import random

    import torch

    from .fresh_memory import accelerator_reachable

    if accelerator_reachable():
        torch.seed()  # the CPU and every accelerator torch was built for
    else:
        # A CPU build: torch.seed() would still queue a seeding for each absent
        # accelerator, formatting a stack trace for each: about 3% of the busy CPU
        # samples of a server under a client loop (py-spy), once per job.
        torch.default_generator.seed()
    random.seed()
    try:
        import numpy

        # 256 bits of the OS's entropy as MT19937's seed array: numpy.random.seed()
        # draws its own through a SeedSequence, which took 0.18 ms of every job's path.
        numpy.random.seed(numpy.frombuffer(os.urandom(32), dtype=numpy.uint32))
    except ImportError:
        pass


def child_processes(pid: "int | str" = "self") -> set[int]:
    """The children of every thread of ``pid`` (an orphan of a PID namespace is its init's)."""
    children: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as file:
                children.update(int(pid) for pid in file.read().split())
    except OSError:
        pass
    return children


def stop_children(known: set[int]) -> int:
    """Kill and reap the child processes a job started (its DataLoader workers, say)."""
    import signal

    children = child_processes() - known
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
    return len(children)


# --- what a job changed in its own process (fork-per-job: reported, never restored) --------


def shared_state() -> dict[str, Any]:
    """torch's process-wide settings and global hooks, cheaply (tens of microseconds).

    With one process per job nothing needs restoring: this only lets the final
    message tell the user what their request changed in its own process.
    """
    import torch
    from torch.nn.modules import module as torch_module

    # Not the random states: each job is reseeded anyway, and copying numpy's took
    # most of this check's time, twice on every job's path.
    state = process_state(random=False)
    state["default device"] = str(torch.get_default_device())
    state["torch function modes"] = torch._C._len_torch_function_stack()
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_module_registration_hooks"):
        registry = getattr(torch_module, name, None)
        if registry is not None:
            state[f"global module hooks ({name.strip('_')})"] = len(registry)
    return state


def shared_state_changes(before: dict[str, Any]) -> list[str]:
    after = shared_state()
    return [f"torch {key}" for key, value in before.items() if after.get(key) != value]

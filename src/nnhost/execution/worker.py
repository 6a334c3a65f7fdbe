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


@dataclass
class WorkerOptions:
    """How a replica process loads its model (JSON-native, crosses a process boundary)."""

    model_key: str
    load_kwargs: dict = field(default_factory=dict)
    torch_threads: int = 0
    #: Environment overrides applied before anything is imported.
    environ: dict = field(default_factory=dict)


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
    return model


def weight_bytes(model: Any) -> int:
    module = model._module
    total = sum(p.nelement() * p.element_size() for p in module.parameters())
    return total + sum(b.nelement() * b.element_size() for b in module.buffers())


def serve(connection: Any, options_json: str) -> None:
    """Entry point of the replica process (spawned by `LocalReplica`)."""
    options = WorkerOptions(**json.loads(options_json))
    os.environ.update(options.environ)

    def send(kind: str, payload: Any) -> None:
        connection.send((kind, payload))

    send("state", {"state": "DEPLOYING", "description": "Loading the model."})
    try:
        import torch

        if options.torch_threads > 0:
            torch.set_num_threads(options.torch_threads)
        started = time.perf_counter()
        model = load_model(options)
        from .runner import Runner

        runner = Runner(model)
    except BaseException:
        send("state", {"state": "UNHEALTHY", "description": traceback.format_exc()})
        connection.close()
        sys.exit(3)
    send(
        "state",
        {
            "state": "RUNNING",
            "description": f"Loaded in {time.perf_counter() - started:.1f}s.",
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
        if kind != "run":
            continue
        spec = JobSpec(**payload)
        runner.run(spec, lambda event: send("event", event.to_dict()))
        send("idle", spec.job_id)

"""The mapped design's template: the process every job's process is forked from, never holding weights.

In the fork design a job's process is a copy of the host, which holds the
weights; on an accelerator that cannot work (a device context does not
survive a fork) and the host would have to run the jobs itself. In the mapped
design the host (`host`) starts this process first thing, before it imports
torch, and tells it the model. The template:

1. builds the model's module tree on the meta device (no weights, no device
   context), with its tokenizer and configuration, from the model cache;
2. makes the runner (the Python layer) and shuts itself in with the layers
   common to every job (`containment`, host part), as the host does in the
   fork design;
3. receives the host's weight handles (`mapped_weights`) and then forks one
   process per job ahead of time (`host.Forker`): each binds the weights into
   its own copy of the tree, takes its own layers (`job_layers`), runs one
   job and exits.

It talks only to the host, which relays between it and the replica: the
same ``fork``/``discard``/``stop`` and ``slot``/``exit`` messages as the
fork design's host, plus, from the host, ``prepare`` (the environment and
policy: it imports the libraries then, before any model is named, so that a
spare host's template is ready too), ``options`` (the model) and
``weights`` (with the handles), and to the host ``state`` (the template's
own: ready, or why it failed).

It never maps the weights itself, never touches a device, and never runs
user code.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback
from typing import TYPE_CHECKING, Any

from .channel import Channel

if TYPE_CHECKING:
    from .worker import WorkerOptions


def main() -> None:
    channel = Channel(socket.socket(fileno=int(sys.argv[1])))
    sys.argv = sys.argv[:1]
    from .worker import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    message, _ = channel.recv()
    if not message or message.get("type") != "prepare":
        sys.exit(2)
    from .policy import WorkerPolicy
    from .worker import WorkerOptions

    policy = WorkerPolicy(**message["policy"])
    from .host import enter_environment

    namespaces_problem = enter_environment(message.get("environ") or {}, policy)
    # A spare host's template waits here too, until the host is given its model.
    message, _ = channel.recv()
    if not message or message.get("type") != "options":
        sys.exit(0 if message is None else 2)
    options = WorkerOptions(**message["options"])

    def state(name: str, description: str, **extra: object) -> None:
        channel.send({"type": "state", "state": name, "description": description, **extra})

    try:
        import torch

        torch.set_num_threads(1)  # a pool started here would hang in a forked child
        model = build_tree(options)
        from .worker import secure

        runner, _, report = secure(model, policy, namespaces_problem, fork_mode=True)
    except BaseException:
        state("UNHEALTHY", "The template process could not build the model's tree:\n" + traceback.format_exc())
        sys.exit(3)
    state("READY", "Module tree built.", containment=report.to_dict())
    message, fds = channel.recv()
    if not message or message.get("type") != "weights" or len(fds) < 3:
        for fd in fds:
            os.close(fd)
        sys.exit(0 if message is None else 2)
    # A request of our own, so that what can be done once (nnsight compiling
    # the trace, torch's first use of each operation, the unpickler and the
    # serializer) is done here and inherited by every job's process. It runs
    # on stand-ins that hold no weights (zeros of stride 0), on the CPU.
    from .mapped_weights import stand_ins
    from .worker import warm_up

    with stand_ins(model):
        problem = warm_up(model, runner)
    if problem:
        print(f"nnhost template {os.getpid()}: no warm-up ({problem[-300:]})", file=sys.stderr, flush=True)
    import gc

    gc.collect()
    gc.freeze()
    from .host import Forker

    state("RUNNING", "Forking job processes.")
    Forker(channel, runner, policy, options, weights=fds).serve()


def build_tree(options: WorkerOptions) -> Any:
    """The model as nnsight builds it, on the meta device: the tree jobs bind weights into."""
    from nnsight.modeling.mixins.remotable import Remotable  # type: ignore[import-untyped]

    model = Remotable.from_model_key(options.model_key, dispatch=False, **options.load_kwargs)
    for parameter in model._module.parameters():
        parameter.requires_grad_(False)
    model._module.eval()
    # Weights arrive in each job's process (`mapped_weights.bind`), never from
    # the model cache: nnsight must not load them itself on the first trace.
    model.dispatched = True
    return model


if __name__ == "__main__":
    main()

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
3. receives the host's weight handles (`weights.mapped`) and then forks one
   process per job ahead of time (`host.Forker`): each binds the weights into
   its own copy of the tree, takes its own layers (`job_layers`), runs one
   job and exits.

It talks only to the host, which relays between it and the replica: the
same `Fork`/`Discard`/`Stop` and `Slot`/`Exit` messages as the fork
design's host (`messages`), plus, from the host, `Prepare` (the environment
and policy: it imports the libraries then, before any model is named, so
that a spare host's template is ready too), `Options` (the model) and
`Weights` (with the handles), and to the host `State` (the template's own:
ready, or why it failed).

It never maps the weights itself, never touches a device, and never runs
user code.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback
from typing import TYPE_CHECKING, Any, Optional

from ..channel import Channel, close_all
from ..messages import Options, Prepare, State, Weights

if TYPE_CHECKING:
    from ..policy import WorkerOptions


def main() -> None:
    channel = Channel(socket.socket(fileno=int(sys.argv[1])))
    sys.argv = sys.argv[:1]
    from ..os_layer.libc import die_with_parent

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from .host import enter_environment, setup_message

    prepare, fds = setup_message(channel, Prepare, gone=2)
    close_all(fds)
    if prepare.policy is None:
        sys.exit(2)  # the host always sends its own
    policy = prepare.policy
    namespaces_problem = enter_environment(dict(prepare.environ), policy)
    # A spare host's template waits here too, until the host is given its model.
    given, fds = setup_message(channel, Options, gone=0)
    close_all(fds)
    options = given.options

    def state(name: str, description: str, containment: Optional[dict[str, Any]] = None) -> None:
        channel.send(State(state=name, description=description, containment=containment))

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
    # A request of our own, so that what can be done once (nnsight compiling
    # the trace, torch's first use of each operation, the unpickler and the
    # serializer) is done here and inherited by every job's process. It runs
    # on stand-ins that hold no weights (zeros of stride 0), on the CPU, so it
    # needs no weights: it runs while the host still loads and exports them
    # (they wait in the channel), not after.
    from ..job.warm_up import warm_up
    from ..weights.mapped import stand_ins

    with stand_ins(model):
        problem = warm_up(model, runner)
    if problem:
        print(f"nnhost template {os.getpid()}: no warm-up ({problem[-300:]})", file=sys.stderr, flush=True)
    _, fds = setup_message(channel, Weights, gone=0)
    if len(fds) < 3:
        close_all(fds)
        sys.exit(2)
    import gc

    gc.collect()
    gc.freeze()
    from .host import Forker

    state("RUNNING", "Forking job processes.")
    Forker(channel, runner, policy, options, weights=fds).serve()


def build_tree(options: WorkerOptions) -> Any:
    """The model as nnsight builds it, on the meta device: the tree jobs bind weights into."""
    from ..nnsight_api import current

    model = current().from_model_key(options.model_key, dispatch=False, **options.load_kwargs)
    for parameter in model._module.parameters():
        parameter.requires_grad_(False)
    model._module.eval()
    # Weights arrive in each job's process (`weights.mapped.bind`), never from
    # the model cache: nnsight must not load them itself on the first trace.
    model.dispatched = True
    return model


if __name__ == "__main__":
    main()

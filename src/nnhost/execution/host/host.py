"""A replica's long-lived process: loads the model once, never runs user code.

Started by the replica as ``python -m nnhost.execution.host.host FD`` with a clean
environment, so neither its argv nor its environment ever held anything of
the server's (the operator's key above all): the one argument is the number of
its channel to the replica (`channel`), the policy and the model's settings
come over that channel and one environment variable.

It loads the model (with one torch thread: a thread pool started here would
hang in a forked child), seals the CPU weights read-only (`weights`), shuts
itself in with the layers common to every job (`containment`, host part),
and then, in **fork mode** (contained, model on the CPU), forks one process
per job ahead of time (`job.process`), each in a new PID namespace. For each
it hands the replica that process's own channel and the read end of its log
pipe; the replica talks to the job's process directly, and tells the host to
fork the next one, or to kill one. The host reaps its children and reports
their exit statuses. It reads nothing a job wrote.

In the **mapped design** (``execution = "mapped"``) the host forks nothing:
it starts a template process (`template`) before it imports torch, loads
the weights, exports them as handles (`weights.mapped`) to the template, and
from then on relays the replica's messages to the template and the
template's back, descriptors included. The template forks the job processes;
each maps the weights. So the process that holds the weights has never had a
job's process as its child.

In **trusted mode** (``containment = false``) and on accelerators, where a
CUDA context cannot cross a fork (see docs/security.md), the host
runs the jobs itself, one after another, as a reusable slot; there the
integrity guard restores what a job changed.

Messages on the control channel (declared in `messages`), replica to host:
`Prepare` and `Options` (its set-up), then `Fork`, `Discard`, `Place`,
`Stop`; host to replica: `State`, `Slot` (descriptors: the job's channel, its
log pipe), `Exit`. Each side reads them with `messages.TO_HOST` and
`messages.FROM_HOST`.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Optional, TypeVar

from ..channel import BadMessage, Channel, close_all, pair
from ..events import cut_description
from ..messages import (
    FROM_HOST,
    TO_HOST,
    TO_JOB,
    Discard,
    Event,
    Exit,
    Export,
    Fork,
    Kinds,
    Message,
    Options,
    Park,
    Place,
    Prepare,
    Ready,
    Resume,
    Slot,
    State,
    Stop,
    ToHost,
    Weights,
)
from ..policy import WorkerOptions
from .parked import park
from .worker import EXIT_MODEL_CHANGED, load_model, place, secure, weight_bytes

if TYPE_CHECKING:
    from ..events import JobEvent, JobSpec
    from ..guard.integrity import ModelGuard
    from ..job.runner import Runner
    from ..policy import WorkerPolicy
    from ..weights.mapped import ExportedWeights


def main() -> None:
    control = Channel(socket.socket(fileno=int(sys.argv[1])))
    sys.argv = sys.argv[:1]
    from ..os_layer.libc import die_with_parent

    die_with_parent()
    # Ctrl-C in a terminal and a service manager's SIGTERM reach the whole
    # process group; the server decides when replicas stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    first, fds = setup_message(control, Prepare, gone=2)
    close_all(fds)
    prepared = prepare(dict(first.environ))
    # A spare host waits here, libraries imported, until a model needs it.
    given, fds = setup_message(control, Options, gone=0)
    close_all(fds)
    options = given.options
    from ..policy import Design

    policy, template = prepared.policy, prepared.template
    design = policy.design(options.home_device)
    if design is Design.MAPPED and template is None:
        template = start_template(prepared.environ, policy)
    elif design is not Design.MAPPED and template is not None:
        template.stop()
        template = None
    if template is not None:
        template.send_options(options)
    fork_mode = design is Design.FORK
    namespaces_problem = prepared.namespaces_problem
    containment: dict[str, Any] = {}

    def state(name: str, description: str, weight_bytes: Optional[int] = None) -> None:
        control.send(State(state=name, description=description, weight_bytes=weight_bytes,
                           containment=dict(containment) if containment else None))

    state("DEPLOYING", "Loading the model.")
    try:
        import torch

        if fork_mode:
            torch.set_num_threads(1)
        elif options.torch_threads > 0:
            torch.set_num_threads(options.torch_threads)
        started = time.perf_counter()
        model = load_model(options)
        if template is not None:
            from ..os_layer.containment import contain

            exported = _export(model)
            host_report = contain(policy.limits, namespaces_problem, host_only=True)
            template_report = template.hand_over(exported)  # keeps them, for runtimes' templates
            containment.update(template_report)
            containment["execution"] = design.value
            state(
                "RUNNING",
                f"Loaded in {time.perf_counter() - started:.1f}s; this process: "
                f"{host_report.describe()}; each job's process is forked from a template "
                "without weights and maps them (the mapped design).",
                weight_bytes(model),
            )
            template.relay(control, options.device, exported)
            os._exit(0)
        runner, guard, report = secure(model, policy, namespaces_problem, fork_mode=fork_mode)
        containment.update(report.to_dict())
        containment["execution"] = design.value
        if fork_mode:
            from ..job.warm_up import warm_up

            problem = warm_up(model, runner)
            if problem:
                print(f"nnhost host {os.getpid()}: no warm-up ({problem[-300:]})", file=sys.stderr, flush=True)
            from ..job.process import may_stay

            if may_stay(runner, options):
                from ..guard.integrity import ModelGuard

                # Taken once, here, after the warm-up: every job's process
                # inherits it and puts the model back to it between two jobs
                # of its owner (`job.process`).
                runner.owner_guard = ModelGuard(model, runner.persistent_objects, weights_sealed=True)
    except BaseException:
        state("UNHEALTHY", traceback.format_exc())
        sys.exit(3)
    mode = "a process per job, or per user's jobs" if fork_mode else "one process for every job"
    state("RUNNING", f"Loaded in {time.perf_counter() - started:.1f}s; {report.describe()}; {mode}.",
          weight_bytes(model))
    if fork_mode:
        import gc

        # Everything loaded so far is kept for good: a garbage collection in a
        # job process would otherwise write to (and so copy) every page of it.
        gc.collect()
        gc.freeze()
        Forker(control, runner, policy, options).serve()
    else:
        serve_in_process(control, model, runner, guard)


S = TypeVar("S", Prepare, Options, Weights)


def setup_message(channel: Channel, kind: type[S], gone: int) -> tuple[S, list[int]]:
    """The set-up message ``kind`` (a host's or the template's), with its descriptors.

    Anything else ends this process with status 2; the sender's end, with ``gone``.
    """
    try:
        message, fds = TO_HOST.receive(channel)
    except (OSError, BadMessage):
        sys.exit(2)
    if message is None:
        sys.exit(gone)
    if not isinstance(message, kind):
        close_all(fds)
        sys.exit(2)
    return message, fds


@dataclass
class Prepared:
    """A host made ready for any model of this server: environment applied, libraries imported."""

    environ: dict[str, str]
    policy: WorkerPolicy
    template: Optional["Template"]
    namespaces_problem: Optional[str]


def prepare(environ: dict[str, str]) -> Prepared:
    """Everything a host does before it knows its model, so that a spare can do it ahead of time.

    The policy travels in the environment and is taken out before it is
    applied. In the mapped design the template is started first, so that it
    imports in parallel.
    """
    from ..policy import WorkerPolicy

    policy = WorkerPolicy.from_environ(environ)
    template = None
    if policy.containment and policy.execution == "mapped":
        template = start_template(environ, policy)
    namespaces_problem = enter_environment(environ, policy)
    return Prepared(environ, policy, template, namespaces_problem)


def enter_environment(environ: dict[str, str], policy: WorkerPolicy) -> Optional[str]:
    """Apply ``environ``, enter the private namespaces, import the libraries (host and template).

    Returns why the namespaces could not be entered, or None.
    """
    os.environ.update(environ)
    namespaces_problem = None
    if policy.containment:
        from ..os_layer.containment import enter_private_namespaces

        namespaces_problem = enter_private_namespaces()
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import multiprocessing

        # Libraries make multiprocessing locks at import (tqdm): under "fork"
        # no resource-tracker process is started outside the containment.
        multiprocessing.set_start_method("fork", force=True)
    _preload(policy)
    return namespaces_problem


def _preload(policy: WorkerPolicy) -> None:
    """Import what loading and serving a model imports (the slow part of a cold start)."""
    import torch  # noqa: F401
    import transformers.pipelines  # noqa: F401  (nnsight builds a pipeline: 1.6 s of imports here)
    from transformers import AutoConfig, AutoModel, AutoTokenizer  # noqa: F401

    from ..nnsight_api import current

    current().preload()

    for name in policy.allowed_imports if policy.containment else ():
        try:
            __import__(name)
        except Exception:
            pass
    try:
        # Built on the first load whatever the model (about 800 regular
        # expressions: 0.3 s of a 0.6 s first load of a small model); every load
        # copies what it needs from this one table, so it can be built now.
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        get_checkpoint_conversion_mapping("")  # type: ignore[no-untyped-call]
    except Exception:
        pass  # another transformers: nothing to build ahead
    import gc

    # What was imported lives as long as the process: collected and frozen here,
    # where a spare host waits, the collection before the first fork walks only
    # what the model added (a full one took 0.8 s in the host and 1.5 s in the
    # template, on the request's path, on a loaded 2-core machine).
    gc.collect()
    gc.freeze()


def _export(model: Any) -> ExportedWeights:
    from ..weights.mapped import export

    return export(model)


class Template:
    """The host's end of the mapped design: starts the template, hands it the weights, relays."""

    def __init__(self, process: subprocess.Popen[bytes], channel: Channel) -> None:
        self.process = process
        self.channel = channel

    def send_options(self, options: WorkerOptions) -> None:
        self.channel.send(Options(options=options))

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.channel.close()

    def expect(self, wanted: str) -> State:
        """The template's next message, which must be its State ``wanted``; else RuntimeError saying why."""
        try:
            message, fds = FROM_HOST.receive(self.channel)
        except BadMessage as error:
            raise RuntimeError(f"the template process sent {error}") from None
        close_all(fds)
        if message is None:
            raise RuntimeError(f"the template process ended ({describe_status(self.process)})")
        if not isinstance(message, State) or message.state != wanted:
            description = message.description if isinstance(message, State) else ""
            raise RuntimeError(str(description or message)[-4000:])
        return message

    def hand_over(self, exported: ExportedWeights) -> dict[str, Any]:
        """Wait for the template's tree, send it the handles; returns its containment report."""
        ready = self.expect("READY")
        self.channel.send(Weights(tensors=exported.tensors), exported.fds)
        self.expect("RUNNING")
        return dict(ready.containment or {})

    def relay(self, control: Channel, device: str, exported: ExportedWeights) -> None:
        """Pass the replica's messages to the template and its answers back, until either ends.

        The host answers `Export` itself, with the handles it gave the template.

        The weights stay where they were exported (``device``): every ready job
        process has mapped them there. A request to move them, or the
        template's end, ends the host (saying why in the server's log), and
        the replica starts a new one.
        """
        # Each message is read as what its sender may send, and written again as
        # that: the replica and the template see only messages of their kinds.
        sockets: dict[socket.socket, tuple[Channel, Kinds[Any], Channel]] = {
            control.sock: (control, TO_HOST, self.channel),
            self.channel.sock: (self.channel, FROM_HOST, control),
        }
        while True:
            ready, _, _ = select.select(list(sockets), [], [])
            for sock in ready:
                source, kinds, target = sockets[sock]
                message: Optional[Message]
                try:
                    message, fds = kinds.receive(source)
                except (OSError, ValueError, BadMessage) as error:
                    # Either end is a process of ours: what it cannot say ends it.
                    print(f"nnhost host {os.getpid()}: {error}", file=sys.stderr, flush=True)
                    message, fds = None, []
                try:
                    if message is None:
                        if source is self.channel:
                            # Not UNHEALTHY (that would mean the model cannot load): this
                            # host ends too, and the replica starts both again.
                            print(f"nnhost host {os.getpid()}: the template process ended "
                                  f"({describe_status(self.process)}); restarting", file=sys.stderr, flush=True)
                            os._exit(3)
                        return
                    if isinstance(message, Export):
                        control.send(Weights(tensors=exported.tensors), exported.fds)
                        continue
                    if isinstance(message, Place):
                        if message.device == device:
                            control.send(State(state="RUNNING", description=(
                                f"Weights on {device} (every job's process maps them).")))
                            continue
                        print(f"nnhost host {os.getpid()}: the mapped design keeps the weights where "
                              f"they were loaded ({device}); a new host loads them on {message.device}",
                              file=sys.stderr, flush=True)
                        os._exit(3)
                    target.send(message, fds)
                    if isinstance(message, Stop):
                        self.process.wait(timeout=10)
                        return
                finally:
                    close_all(fds)


def start_template(environ: dict[str, str], policy: WorkerPolicy, python: str = sys.executable,
                   env: Optional[dict[str, str]] = None) -> Template:
    """Start a template with ``python`` (a runtime's, or this one) and ``env`` (by default this
    host's clean environment); it applies ``environ`` itself, from the `Prepare` sent here."""
    ours, theirs = pair()
    process = subprocess.Popen(
        [python, "-m", "nnhost.execution.host.template", str(theirs.fileno())],
        pass_fds=[theirs.fileno()], env=dict(os.environ) if env is None else env,
        stdin=subprocess.DEVNULL, close_fds=True,
    )
    theirs.close()
    channel = Channel(ours)
    channel.send(Prepare(environ=environ, policy=policy))
    return Template(process, channel)


def describe_status(process: subprocess.Popen[bytes]) -> str:
    from ..job.process import describe_exit

    return describe_exit(process.poll())


class Forker:
    """Keeps job processes coming; kills and reaps them; never reads what they write."""

    def __init__(self, control: Channel, runner: Runner, policy: WorkerPolicy, options: WorkerOptions,
                 weights: Optional[list[int]] = None) -> None:
        from ..os_layer.job_layers import PidNamespaces

        self.control = control
        self.runner = runner
        self.policy = policy
        self.options = options
        #: The mapped design: the weight handles each job's process binds (`weights.mapped`).
        self.weights = weights
        self.namespaces = PidNamespaces()
        self.children: set[int] = set()
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)

    def serve(self) -> None:
        while True:
            try:
                watched: list[socket.socket | int] = [self.control.sock, self.wake_r]
                ready, _, _ = select.select(watched, [], [], 1.0)
            except InterruptedError:
                ready = []
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            self._reap()
            if self.control.sock not in ready:
                continue
            message: Optional[ToHost]
            try:
                message, fds = TO_HOST.receive(self.control)
            except (OSError, ValueError):
                message, fds = None, []
            except BadMessage as error:
                # The replica's (or the host's) own mistake: said, and passed over.
                print(f"nnhost forker {os.getpid()}: it sent {error}", file=sys.stderr, flush=True)
                continue
            close_all(fds)
            if message is None:
                break  # the replica is gone
            if isinstance(message, Fork):
                self._fork(message.memory_cgroup, message.warm)
            elif isinstance(message, Discard):
                if message.pid in self.children:
                    os.kill(message.pid, signal.SIGKILL)
            elif isinstance(message, Park):
                if message.pid in self.children:
                    park(message.pid, message.most_bytes)
            elif isinstance(message, Resume):
                if message.pid in self.children:
                    os.kill(message.pid, signal.SIGCONT)
            elif isinstance(message, Place):
                self.control.send(State(state="RUNNING",
                                        description="Weights on cpu (every job's process shares them)."))
            elif isinstance(message, Export):
                self._export()
            elif isinstance(message, Stop):
                break
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)

    def _export(self) -> None:
        """The weights' handles, to the replica, for a runtime's template (this host's own pages)."""
        from ..weights.mapped import export

        image = getattr(self.runner, "weight_image", None)
        if image is None or image.fd < 0:
            # Only a replica with runtimes asks, and then the image kept its descriptor.
            print(f"nnhost host {os.getpid()}: asked for the weights' handles, which it did not keep",
                  file=sys.stderr, flush=True)
            return
        exported = export(self.runner.model, image=image)
        try:
            self.control.send(Weights(tensors=exported.tensors), exported.fds)
        finally:
            exported.close()

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.control.send(Exit(pid=pid, status=os.waitstatus_to_exitcode(status)))

    def _fork(self, memory_cgroup: bool, warm: bool = True) -> None:
        ours, theirs = pair()
        log_r, log_w = os.pipe2(os.O_CLOEXEC)
        pid = self.namespaces.fork()
        if pid == 0:
            from ..job.process import live

            ours.close()
            os.close(log_r)
            live(theirs, log_w, self.runner, self.policy, self.options, memory_cgroup, self.weights, warm)
        theirs.close()
        os.close(log_w)
        self.children.add(pid)
        try:
            self.control.send(Slot(pid=pid, reusable=False, pid_namespace=self.namespaces.problem is None),
                              [ours.fileno(), log_r])
        finally:
            ours.close()
            os.close(log_r)


def serve_in_process(control: Channel, model: Any, runner: Runner, guard: Optional[ModelGuard]) -> None:
    """Trusted mode and accelerators: this process runs every job, one after another."""
    from ..handoff import receive_job

    ours, theirs = pair()
    control.send(Slot(pid=os.getpid(), reusable=True), [theirs.fileno()])
    theirs.close()
    jobs = Channel(ours)
    jobs.send(Ready())
    while True:
        ready, _, _ = select.select([control.sock, jobs.sock], [], [])
        if control.sock in ready:
            order, fds = TO_HOST.receive(control)
            close_all(fds)
            if order is None or isinstance(order, Stop):
                return
            if isinstance(order, Place):
                place(model, order.device)
                if guard is not None:
                    guard.rebaseline()
                control.send(State(state="RUNNING", description=f"Weights on {order.device}."))
            continue
        job, fds = TO_JOB.receive(jobs)
        if job is None:
            return
        spec = receive_job(job, fds)
        intact = run_one_guarded(spec, runner, jobs)
        if not intact:
            # The job changed the model in a way that cannot be undone: exit,
            # and the replica starts a fresh process from the checkpoint.
            sys.exit(EXIT_MODEL_CHANGED)
        jobs.send(Ready())


def run_one_guarded(spec: JobSpec, runner: Runner, jobs: Channel) -> bool:
    def emit(event: JobEvent) -> None:
        jobs.send(Event.of(replace(event, description=cut_description(event.description))))

    return runner.run(spec, emit)


if __name__ == "__main__":
    main()

"""A replica's other runtimes: a template per nnsight version, mapping the host's weights.

A job of a client whose nnsight is not the server's own runs in a process of
that version's runtime (`nnhost.runtimes`), forked from a template started
with the runtime's Python (`execution.host.template`, the same program as the
mapped design's). The replica starts it beside its host, on the first job of
that version: the template builds the model's tree on the meta device with
its own nnsight, the replica asks the host for the weights' handles
(`messages.Export`) and passes them on, and from then on the template forks
that version's job processes, each mapping the host's weights. So a runtime
costs a process and its ready job process, never a second copy of the model.

The template talks to the replica directly, with the messages a host uses
(`Fork`, `Discard`, `Park`, `Resume`, `Stop`; `Slot`, `Exit`, `State`), on a
channel of its own, read by one thread that also started it (a parent-death
signal follows the thread that forked). What it says about its job
processes goes to the replica's `slots.JobProcesses`, told which runtime.

It never reads anything a job wrote, and never decides which job runs where:
`slots.JobProcesses` does.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Optional, Protocol

from ..execution.channel import BadMessage, Channel, close_all
from ..execution.guard.process_state import child_processes
from ..execution.host.host import describe_status, start_template
from ..execution.host.parked import private_bytes
from ..execution.messages import FROM_HOST, Exit, Export, Fork, Message, State, Weights
from ..execution.messages import Slot as SlotMessage
from ..execution.policy import WorkerOptions, WorkerPolicy
from .spare_hosts import clean_environment

log = logging.getLogger("nnhost.replica")


class RuntimeSide(Protocol):
    """What the runtimes need of their replica."""

    @property
    def generation(self) -> int: ...

    def send_control(self, message: Message) -> None: ...

    def runtime_slot(self, runtime: str, message: SlotMessage, fds: list[int], generation: int) -> None:
        """A job process of ``runtime`` (descriptors: its channel, its log pipe)."""

    def runtime_exit(self, pid: int, status: int) -> None:
        """The template reaped its job process ``pid``."""

    def runtime_failed(self, runtime: str, description: str) -> None:
        """``runtime``'s template could not start, or ended: its waiting jobs fail with ``description``."""


@dataclass(eq=False)
class Template:
    """One runtime's template process, and what waits for it."""

    runtime: str
    generation: int
    channel: Optional[Channel] = None
    process: Optional[subprocess.Popen[bytes]] = None
    running: bool = False
    stopping: bool = False
    #: Messages for it before it is running (its first `Fork`), sent in order once it is.
    pending: list[Message] = field(default_factory=list)
    #: The host's weight handles, once they arrived for it.
    weights: Optional[tuple[int, list[int]]] = None
    arrived: threading.Event = field(default_factory=threading.Event)


class RuntimeTemplates:
    """The templates of one replica's runtimes other than the host's own."""

    def __init__(self, name: str, policy: WorkerPolicy, options: WorkerOptions, replica: RuntimeSide,
                 host_environment: tuple[str, ...]) -> None:
        self.name = name
        self.policy = policy
        self.options = options
        self._replica = replica
        self._host_environment = host_environment
        self._lock = threading.Lock()
        self._templates: dict[str, Template] = {}
        #: Templates that asked the host for the weights, oldest first (its answers come in that order).
        self._awaiting_weights: list[Template] = []

    def send(self, runtime: str, message: Message) -> None:
        """Send ``message`` to ``runtime``'s template; a `Fork` starts it first if it is not there.

        Anything else for a template that is gone is dropped: the job processes
        it names ended with it.
        """
        with self._lock:
            template = self._templates.get(runtime)
            if template is None:
                if not isinstance(message, Fork):
                    return
                template = Template(runtime, self._replica.generation)
                self._templates[runtime] = template
                threading.Thread(target=self._live, args=(template,), name=f"runtime-{runtime}-{self.name}",
                                 daemon=True).start()
            if not template.running:
                template.pending.append(message)
                return
            channel = template.channel
        assert channel is not None  # set before it is running
        try:
            channel.send(message)
        except OSError:
            pass  # it ended: its thread reports that

    def weights(self, message: Weights, fds: list[int]) -> None:
        """The host's answer to an `Export`: for the template that asked first."""
        with self._lock:
            template = self._awaiting_weights.pop(0) if self._awaiting_weights else None
        if template is None:
            close_all(fds)
            return
        template.weights = (message.tensors, fds)
        template.arrived.set()

    def memory(self) -> dict[str, int]:
        """Each running runtime's own memory: its template's and its job processes' private bytes."""
        with self._lock:
            running = {name: t.process.pid for name, t in self._templates.items()
                       if t.running and t.process is not None}
        return {name: sum(_private_bytes(one) for one in _tree(pid)) for name, pid in sorted(running.items())}

    def stop(self, runtime: Optional[str] = None) -> None:
        """Stop ``runtime``'s template (all of them, with None); its job processes end with it."""
        with self._lock:
            names = [runtime] if runtime is not None else list(self._templates)
            stopped = [self._templates.pop(name) for name in names if name in self._templates]
        for template in stopped:
            template.stopping = True
            template.arrived.set()
            if template.channel is not None:
                _hang_up(template.channel)  # its forker kills its job processes and ends
            if template.process is not None and template.process.poll() is None:
                try:
                    template.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    template.process.kill()

    # -- each template's own thread ------------------------------------------------------

    def _live(self, template: Template) -> None:
        try:
            self._start(template)
        except Exception as error:
            self._failed(template, f"The nnsight {template.runtime} runtime could not start: {error}")
            return
        assert template.channel is not None
        while True:
            try:
                message, fds = FROM_HOST.receive(template.channel)
            except (OSError, BadMessage) as error:
                log.warning("the nnsight %s template of %s: %s", template.runtime, self.name, error)
                message, fds = None, []
            if message is None:
                break
            if isinstance(message, SlotMessage) and len(fds) >= 1 and not message.reusable:
                self._replica.runtime_slot(template.runtime, message, fds, template.generation)
            elif isinstance(message, Exit):
                self._replica.runtime_exit(message.pid, message.status)
            else:
                close_all(fds)
                if isinstance(message, State):
                    log.warning("the nnsight %s template of %s: %s %s", template.runtime, self.name,
                                message.state, message.description[-2000:])
        self._failed(template, f"The nnsight {template.runtime} runtime's template process ended "
                               f"({describe_status(template.process) if template.process else 'not started'}).")

    def _start(self, template: Template) -> None:
        python = self.policy.runtimes.get(template.runtime)
        if python is None or not os.path.exists(python):
            raise RuntimeError(f"no runtime is installed for it ({python or 'none configured'}); "
                               f"`nnhost runtimes {template.runtime}` builds it")
        environ = dict(self.options.environ)
        policy = WorkerPolicy.from_environ(environ)  # the template gets it as a message
        started = start_template(environ, policy, python=python, env=clean_environment(self._host_environment))
        template.process, template.channel = started.process, started.channel
        channel = started.channel
        if template.stopping:
            raise RuntimeError("its replica stopped")
        started.send_options(self.options)
        started.expect("READY")
        with self._lock:
            self._awaiting_weights.append(template)
        self._replica.send_control(Export())
        if not template.arrived.wait(self.policy.job_start_timeout) or template.weights is None:
            raise RuntimeError("the model's worker did not hand over its weights")
        tensors, fds = template.weights
        try:
            channel.send(Weights(tensors=tensors), fds)
        finally:
            close_all(fds)
        started.expect("RUNNING")
        with self._lock:
            template.running = not template.stopping
            pending, template.pending = template.pending, []
        for message in pending:
            channel.send(message)
        log.info("%s: the nnsight %s runtime is running (template %s)", self.name, template.runtime,
                 template.process.pid)

    def _failed(self, template: Template, description: str) -> None:
        with self._lock:
            if self._templates.get(template.runtime) is template:
                del self._templates[template.runtime]
            if template in self._awaiting_weights:
                self._awaiting_weights.remove(template)
        if template.channel is not None:
            _hang_up(template.channel)
        if template.process is not None:
            try:
                template.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                template.process.kill()
                template.process.wait()
        if not template.stopping:
            log.error("%s: %s", self.name, description)
            self._replica.runtime_failed(template.runtime, description)


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it, from ``/proc`` (gone ones are left out)."""
    found, frontier = [], [pid]
    while frontier:
        one = frontier.pop()
        found.append(one)
        frontier += child_processes(one)
    return found


def _private_bytes(pid: int) -> int:
    """What ending ``pid`` would free (`parked.private_bytes`); 0 for one that is gone."""
    try:
        return private_bytes(pid)
    except OSError:
        return 0


def _hang_up(channel: Channel) -> None:
    """Close ``channel``, waking the thread that reads it (a plain close would not)."""
    try:
        channel.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    channel.close()

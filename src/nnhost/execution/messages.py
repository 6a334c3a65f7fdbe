"""The messages between a replica and its processes: one declared type per kind, read in one place.

A replica (`replicas.replica`, `replicas.slots`) talks to its host
process (`host`), the host to the mapped design's template (`template`), and
the replica to each job's process (`job.process`), over `channel.Channel`:
one JSON object per packet, with descriptors alongside. Each kind of object
is a pydantic model here, discriminated by its ``type``, and each receiver
names the kinds it accepts with a `Kinds` (`TO_HOST`, `FROM_HOST`, `TO_JOB`,
`FROM_JOB`, ...): ``kinds.parse(raw)`` (or ``kinds.receive(channel)``) gives
the typed message or raises `channel.BadMessage` saying what is wrong, in
words that complete "it sent ...". Senders build the models;
`channel.Channel.send` writes them.

What a job's process sends is untrusted (it ran a stranger's code): its two
kinds, `Ready` and `Event`, are held to the rules of `events` (the job-id
rule, the statuses, the description and LOG-line limits, the meta table),
defined there once because the controller's intake checks a `JobEvent` with
the same `events.event_problem`. A message that breaks one is refused with
that rule's own words. The Ray actor's reports to the controller
(`replicas.ray_host` to `replicas.ray_replica`) are declared here too
(`FROM_RAY_ACTOR`), though they travel through Ray rather than a channel.

This module is a leaf: it must never import the replica, the job service or
anything that runs a model, so that every process of a replica can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Generic, Literal, Optional, TypeVar, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from .channel import BadMessage, Channel, close_all
from .events import JobEvent, JobSpec, event_problem
from .policy import WorkerOptions, WorkerPolicy


class Message(BaseModel):
    """Any message on a replica's channels."""

    # Strict and closed: a message comes from another process, so nothing is
    # coerced and an unknown key is a mistake, not something to ignore.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def _built(cls: type[Any]) -> BeforeValidator:
    """Reads a dataclass field from the plain object JSON made of it, with the dataclass itself.

    These (the options, the policy, the job) are what the server hands its
    own processes, never what a job wrote: built as the dataclass builds
    them (its ``__post_init__`` included), as before they were declared here.
    """

    def build(value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value  # an instance passes, anything else is refused as not one
        try:
            return cls(**value)
        except TypeError as error:
            raise ValueError(str(error)) from None

    return BeforeValidator(build)


_Options = Annotated[WorkerOptions, _built(WorkerOptions)]
_Policy = Annotated[WorkerPolicy, _built(WorkerPolicy)]
_Job = Annotated[JobSpec, _built(JobSpec)]

# -- the replica (or the host) to a host or the template -------------------------------------


class Prepare(Message):
    """Get ready for any model: apply ``environ`` (the worker's environment), import the libraries.

    To the template, the host adds its ``policy`` (the host takes its own out of ``environ``).
    """

    type: Literal["prepare"] = "prepare"
    environ: dict[str, str]
    policy: Optional[_Policy] = None


class Options(Message):
    """Load this model (a spare host or template waits for this one message)."""

    type: Literal["options"] = "options"
    options: _Options


class Weights(Message):
    """The host's weights: ``tensors`` handles, as descriptors (`weights.mapped`).

    From the host to its template, and to the replica when it asked (`Export`),
    which hands them on to a runtime's template (`replicas.runtimes`).
    """

    type: Literal["weights"] = "weights"
    tensors: int


class Export(Message):
    """Send the weights' handles (`Weights`): a runtime's template maps the same weights."""

    type: Literal["export"] = "export"


class Fork(Message):
    """Make the next job's process; ``memory_cgroup``: the replica puts it in a memory cgroup.

    ``warm``: it runs a request of its own before it says it is ready (see
    `job.process.live`): the first process of a host no job waits for. One
    forked while a job runs says it is ready at once, and warms up only when
    told (`Warm`), so that its warm-up does not take the running job's CPU.
    """

    type: Literal["fork"] = "fork"
    memory_cgroup: bool
    warm: bool = True


class Discard(Message):
    """Kill the job process ``pid`` (its job ended, or it broke the protocol)."""

    type: Literal["discard"] = "discard"
    pid: int


class Park(Message):
    """Stop the job process ``pid`` (SIGSTOP) between two jobs of its owner, or kill it.

    It ran one user's job and waits for that user's next (`replicas.slots`).
    Stopped, nothing it left behind (a thread its job started) runs while no
    job of that user does; a child of its own would not be stopped with it,
    so one that has a child is killed instead, as is one that keeps more than
    ``most_bytes`` of memory of its own.
    """

    type: Literal["park"] = "park"
    pid: int
    most_bytes: int


class Resume(Message):
    """Let the parked job process ``pid`` run again (SIGCONT): its owner's next job is on its channel."""

    type: Literal["resume"] = "resume"
    pid: int


class Place(Message):
    """Move the weights to ``device`` (HOT on the model's device, WARM on the CPU)."""

    type: Literal["place"] = "place"
    device: str


class Stop(Message):
    type: Literal["stop"] = "stop"


# -- a host or the template to the replica (or the host) -------------------------------------


class State(Message):
    """How the host is doing: a `contract.ReplicaStatus` name, or the template's READY.

    ``state`` is plain text: the replica reads a name it does not know as a
    sick worker and says so, rather than refusing the message.
    """

    type: Literal["state"] = "state"
    state: str
    description: str = ""
    weight_bytes: Optional[int] = None
    containment: Optional[dict[str, Any]] = None
    #: A Ray replica's other runtimes and their memory (`contract.ReplicaState.runtimes`).
    runtimes: Optional[dict[str, int]] = None


class Slot(Message):
    """A process ready to be given jobs; descriptors: its channel, then its log pipe (if any).

    ``reusable``: the host itself (trusted mode, accelerators), which runs one
    job after another; otherwise a job's process, which runs one.
    """

    type: Literal["slot"] = "slot"
    pid: int
    reusable: bool
    pid_namespace: Optional[bool] = None


class Exit(Message):
    """The job process ``pid`` ended with ``status`` (an exit code, or minus a signal)."""

    type: Literal["exit"] = "exit"
    pid: int
    status: int


# -- the replica and a job's process ---------------------------------------------------------


class Run(Message):
    """The job of a job's process (the next of its owner's, or of a reusable slot).

    Descriptors: the payload, the result file and any adapter files, in that
    order; the paths in ``job`` are blank and its descriptors -1 (`handoff`).
    """

    type: Literal["run"] = "run"
    job: _Job
    #: After this job, the process may wait for its owner's next one (`Ready`)
    #: instead of exiting, if the job left the model as it found it and the
    #: process keeps at most this many bytes of its own (0: it exits).
    stay_within: int = 0


class Warm(Message):
    """To a ready job's process with no job yet: run a request of your own now (see `Fork`).

    Sent when the replica's running job has ended and none waited for this
    process when it was asked for; a job that comes meanwhile waits in the
    channel for the warm-up (one small request of the server's own) to end.
    """

    type: Literal["warm"] = "warm"


class Ready(Message):
    """A job's process is contained and waits for its job; ``containment``: its layers.

    Also sent after a job told it may stay (`Run`): it waits for its owner's next.
    """

    type: Literal["ready"] = "ready"
    containment: Optional[dict[str, Any]] = None


#: A value of an event's meta table (`events.event_problem` says how long, how many).
MetaValue = Union[bool, int, float, str, None]


class Event(Message):
    """Something that happened to the job: RUNNING, a LOG line, or its final COMPLETED or ERROR.

    Its fields obey `events.event_problem`, the rule the controller's intake
    applies to a `JobEvent` too: a message that breaks it is refused in the
    rule's own words. Whether it fits its job (the right job, in order) is
    `replicas.job_watch`'s business.
    """

    type: Literal["event"] = "event"
    job_id: str
    status: str
    description: str = ""
    meta: Optional[dict[str, MetaValue]] = None
    result_size: Optional[int] = None

    @model_validator(mode="before")
    @classmethod
    def _obeys_the_event_rules(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            problem = event_problem({key: value for key, value in data.items() if key != "type"})
            if problem is not None:
                raise PydanticCustomError("event", "{problem}", {"problem": problem})
        return data

    @classmethod
    def of(cls, event: JobEvent) -> Event:
        """The message of a job's event (the job's process checks its own events no less)."""
        return cls(job_id=event.job_id, status=event.status, description=event.description,
                   meta=event.meta, result_size=event.result_size)

    def job_event(self) -> JobEvent:
        return JobEvent(self.job_id, self.status, self.description,
                        meta=dict(self.meta) if self.meta is not None else None,
                        result_size=self.result_size)


# -- a Ray actor to the controller (through Ray, not a channel) ------------------------------


class RayJobEvent(Message):
    """A job's event on the node; a COMPLETED one brings the result's bytes (None: lost)."""

    type: Literal["job"] = "job"
    event: Event
    result: Optional[bytes] = None


class RayIdle(Message):
    type: Literal["idle"] = "idle"
    accepting: bool


class RayIncident(Message):
    """One of `replicas.incidents.Incident`, by value."""

    type: Literal["incident"] = "incident"
    incident: str


M = TypeVar("M", bound=Message)


class Kinds(Generic[M]):
    """The kinds of message one receiver accepts (`M`, their union), read with `parse` or `receive`."""

    def __init__(self, *models: type[M], descriptors: bool = True) -> None:
        self.models: dict[str, type[M]] = {model.model_fields["type"].default: model for model in models}
        #: Whether a message may bring descriptors (a job's process may send none).
        self.descriptors = descriptors

    def parse(self, raw: object) -> M:
        """The message ``raw`` (a JSON object) is, or `BadMessage` saying what is wrong."""
        if not isinstance(raw, Mapping):
            raise BadMessage("not a JSON object")
        kind = raw.get("type")
        model = self.models.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise BadMessage(f"an unexpected message ({repr(kind)[:40]})")
        try:
            return model.model_validate(raw)
        except ValidationError as error:
            raise BadMessage(_refusal(str(kind), error)) from None

    def receive(self, channel: Channel) -> tuple[Optional[M], list[int]]:
        """The next message on ``channel`` and its descriptors; ``(None, [])`` once the peer is gone.

        Raises `BadMessage` (with the descriptors closed) for a message that is not one of these.
        """
        raw, fds = channel.recv()
        if raw is None:
            return None, []
        try:
            if fds and not self.descriptors:
                raise BadMessage("file descriptors")
            return self.parse(raw), fds
        except BadMessage:
            close_all(fds)
            raise


def _refusal(kind: str, error: ValidationError) -> str:
    problems = error.errors()
    if kind == "event" and problems and problems[0]["type"] == "event":
        return f"an event {problems[0]['msg']}"  # the words of `events.event_problem`
    where = "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'the message'}: {problem['msg']}"
        for problem in problems
    )
    return f"a malformed {kind} message ({where[:300]})"


#: What a host reads from the replica (a template, from its host): its set-up, then commands.
ToHost = Union[Prepare, Options, Weights, Export, Fork, Discard, Park, Resume, Place, Stop]
TO_HOST: Kinds[ToHost] = Kinds(Prepare, Options, Weights, Export, Fork, Discard, Park, Resume, Place, Stop)
#: What the replica reads from its host (the host, from its template).
FromHost = Union[State, Slot, Exit, Weights]
FROM_HOST: Kinds[FromHost] = Kinds(State, Slot, Exit, Weights)
#: What a job's process (or a reusable slot) reads from the replica.
TO_JOB: Kinds[Run] = Kinds(Run)
#: What a job's own process reads before its job: its job, or first a word to warm up.
TO_SPARE: Kinds[Union[Run, Warm]] = Kinds(Run, Warm)
#: What the replica reads from a job's process: untrusted, and never with descriptors.
FromJob = Union[Ready, Event]
FROM_JOB: Kinds[FromJob] = Kinds(Ready, Event, descriptors=False)
#: What the controller reads from a Ray replica's actor.
FromRayActor = Union[State, RayJobEvent, RayIdle, RayIncident]
FROM_RAY_ACTOR: Kinds[FromRayActor] = Kinds(State, RayJobEvent, RayIdle, RayIncident)

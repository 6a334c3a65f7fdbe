"""What the API processes and the controller tell each other: commands, answers, the board.

An API process asks the controller to deploy, evict or cancel (`controls`);
with separate processes the command is a row of the database's ``commands``
table and its answer is written back into the row (`relay`). Both sides
program against the types here, so a command or an answer is one declared
shape, not a dictionary each side checks its own way:

- `Command` is a union discriminated by ``type`` (`Deploy`, `Evict`,
  `Cancel`); in a row, ``kind`` holds the type and ``args`` the rest.
  `parse_command` is the one place a command is read: the controller checks
  each row with it before acting, as an API process checks what it sends.
- `Answer` is what the controller wrote: ``{"ok": <result>}`` with the
  command's own result type, or ``{"refused": [code, detail]}``. An API
  process reads it with `read_answer`.
- `Board` is what the controller reports (`board`): every model's state,
  queue and memory, which ``/status``, the status page, the operator page
  and ``/metrics`` show. Its JSON is what those serve, key for key; an API
  process reads a published one with `Board.read`.

What is read was written by another process: these are untrusted, and a
malformed one is refused with `MalformedMessage` (a `ValueError`) saying
what is wrong. This module is a leaf: it must never import the controller,
the database or HTTP, so that either side may import it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

from ..execution.events import JOB_ID

#: A job id as the server issues them (`execution.events.JOB_ID`, the one rule).
JobId = Annotated[str, Field(pattern=f"^{JOB_ID.pattern}$")]


class MalformedMessage(ValueError):
    """A command, an answer or a board that is not one: ``str()`` says what is wrong with it."""


def problems(error: ValidationError) -> str:
    """A validation error in one line: each field that failed and why."""
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'the message'}: {problem['msg']}"
        for problem in error.errors()
    )


class _Message(BaseModel):
    # Strict and closed: a message comes from another process, so nothing is
    # coerced and an unknown key is a mistake, not something to ignore.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


# -- results -------------------------------------------------------------------------------

class Deployed(_Message):
    """A deployment now at (or on its way to) ``target``."""

    model: str
    target: str
    note: str


class Evicted(_Message):
    model: str
    target: str


class Cancelled(_Message):
    id: str
    cancelled: bool


Result = Union[Deployed, Evicted, Cancelled]
#: Named outside the commands, whose field ``type`` hides the builtin in their bodies.
ResultType = type[Result]


# -- commands ------------------------------------------------------------------------------

class Deploy(_Message):
    """Bring ``model`` to ``level`` (``hot`` or ``warm``; `controls.deploy` says which it takes)."""

    type: Literal["deploy"] = "deploy"
    model: str
    level: str = "hot"
    result: ClassVar[ResultType] = Deployed


class Evict(_Message):
    """Make ``model`` COLD, unless it has work."""

    type: Literal["evict"] = "evict"
    model: str
    result: ClassVar[ResultType] = Evicted


class Cancel(_Message):
    """Cancel a job that has not ended."""

    type: Literal["cancel"] = "cancel"
    job_id: JobId
    result: ClassVar[ResultType] = Cancelled


Command = Annotated[Union[Deploy, Evict, Cancel], Field(discriminator="type")]
_COMMAND: TypeAdapter[Command] = TypeAdapter(Command)
#: The command types by name, as the ``kind`` column holds them.
KINDS: tuple[str, ...] = ("deploy", "evict", "cancel")


def parse_command(kind: object, args: object) -> Command:
    """The command of kind ``kind`` with arguments ``args`` (a dict, or a row's JSON text)."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise MalformedMessage(f"Unknown command {kind!r}")
    if isinstance(args, (str, bytes)):
        try:
            args = json.loads(args)
        except ValueError:
            raise MalformedMessage(f"Malformed {kind} command: its arguments are not JSON") from None
    if not isinstance(args, dict):
        raise MalformedMessage(f"Malformed {kind} command: its arguments are not an object")
    if "type" in args:
        raise MalformedMessage(f"Malformed {kind} command: 'type' is not an argument")
    try:
        return _COMMAND.validate_python({**args, "type": kind})
    except ValidationError as error:
        raise MalformedMessage(f"Malformed {kind} command: {problems(error)}") from None


def command_row(command: Command) -> tuple[str, str]:
    """``kind`` and ``args`` of the command's row."""
    return command.type, json.dumps(command.model_dump(exclude={"type"}))


# -- answers -------------------------------------------------------------------------------

#: With separate processes: the bus name the controller listens on for "something
#: new is in the database" (an API process stored a job or a command).
WAKE = "nnhost-controller-wake"
#: The ``shared_values`` row the controller publishes its board in, and how often.
BOARD = "board"
PUBLISH_EVERY = 1.0

#: The HTTP statuses a refusal may carry (an error's, never a success's).
RefusalCode = Annotated[int, Field(ge=400, le=599)]


class Refused(RuntimeError):
    """The controller will not do what was asked (a `Refusal` as an exception); ``code`` is the HTTP status that says why."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class Done(_Message):
    ok: dict[str, Any]


class Refusal(_Message):
    refused: tuple[RefusalCode, str]


Answer = Union[Done, Refusal]
_ANSWER: TypeAdapter[Answer] = TypeAdapter(Answer)


def answer_text(answer: Answer) -> str:
    """The answer as its row holds it."""
    return answer.model_dump_json()


def read_answer(raw: Optional[str], command: Command) -> Union[Result, Refusal]:
    """What the controller answered to ``command``: its result, or its refusal."""
    try:
        answer = _ANSWER.validate_json(raw or "")
    except ValidationError as error:
        raise MalformedMessage(f"The controller's answer is malformed: {problems(error)}") from None
    if isinstance(answer, Refusal):
        return answer
    try:
        return command.result.model_validate(answer.ok)
    except ValidationError as error:
        raise MalformedMessage(
            f"The controller's answer to {command.type} is malformed: {problems(error)}"
        ) from None


# -- the board -----------------------------------------------------------------------------

#: A count or an amount as it was measured: an int stays an int and a float a float, so
#: the JSON served is the JSON measured (a Ray node's CPUs are floats, a budget is bytes).
Number = Union[int, float]


class _Given(_Message):
    """An entry whose optional keys are in its JSON only when they were given.

    The dictionaries these replace had some keys only sometimes (a replica's
    pid, the recent-jobs medians), and ``/status`` and the pages serve them as
    they were: a key that was not given is left out, not written as null.
    """

    @model_serializer(mode="wrap")
    def _given_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if key in self.model_fields_set}


class Replicas(_Message):
    """How many replicas a model has, wants and may have, and in which states."""

    total: int
    running: int
    configured: int
    most: int
    by_state: dict[str, int]


class Containment(_Message):
    """The containment layers a model's jobs run under, as the status page lists them."""

    enabled: bool
    mode: str
    execution: str
    active: list[str]
    unavailable: dict[str, str]


class ModelEntry(_Given):
    """One model on the status page, the operator page and ``/metrics``."""

    name: str
    repo_id: str
    level: str
    target: str
    state: str
    replicas: Replicas
    queued: int
    running: int
    #: Containment incidents by kind (`replicas.incidents`), worker restarts included.
    incidents: dict[str, int]
    # The last hour's jobs (`telemetry.recent`), when the controller keeps that history.
    median_wait_seconds: Optional[Number] = None
    median_run_seconds: Optional[Number] = None
    completed: Optional[int] = None
    errors: Optional[int] = None
    containment: Optional[Containment]
    description: str
    note: str


class StatusEntry(_Given):
    """One replica in ``/status``'s ``deployments`` (one COLD entry for a model without any).

    The keys are the nnsight client's (``nnsight.status()``), built by
    `controller.report`; the board adds ``queued``.
    """

    deployment: str
    model_key: str
    repo_id: str
    revision: str
    task: Optional[str]
    trust_remote_code: bool
    device: str
    devices: list[str]
    size_bytes: Optional[int]
    note: str
    deployment_level: str
    application_state: str
    description: Optional[str] = None
    busy: bool
    pid: Optional[int] = None
    #: The replica's own containment report, as it gave it.
    containment: Optional[dict[str, Any]] = None
    #: Other nnsight versions' runtimes running beside it, and the bytes each holds.
    runtimes: Optional[dict[str, int]] = None
    queued: Optional[int] = None


class Device(_Message):
    """A device's memory budget and what models placed there hold."""

    budget_bytes: Number
    used_bytes: Number


class NodeRoom(_Message):
    """A Ray node in ``/status``'s ``nodes``: what it offers and what replicas hold there."""

    address: str
    budget_bytes: Number
    used_bytes: Number
    cpus: Number
    cpus_used: Number
    gpus: Number
    gpus_used: Number
    replicas: list[str]


class Minute(_Message):
    """Jobs that ended in one minute."""

    completed: int
    errors: int


class Board(_Message):
    """What the controller reports: every model's state, queues and memory, as one value.

    It holds nothing of any user's: no job ids, no emails. ``stale`` and
    ``published_seconds_ago`` are the reader's (`front.database_link.read_board`), never
    the controller's: they say how old a published board is.
    """

    draining: bool = False
    models: list[ModelEntry] = []
    deployments: dict[str, StatusEntry] = {}
    #: This machine's budgets; on a cluster the nodes' sum (each node's own is in ``nodes``).
    devices: dict[str, Device] = {}
    nodes: Optional[dict[str, NodeRoom]] = None
    per_minute: list[Minute] = []
    generated_at: float = 0.0
    stale: bool = False
    published_seconds_ago: Optional[float] = None

    def text(self) -> str:
        """The board as the controller publishes it (without the reader's fields)."""
        return self.model_dump_json(exclude={"stale", "published_seconds_ago"})

    @classmethod
    def read(cls, raw: Union[str, bytes]) -> "Board":
        """A published board; `MalformedMessage` saying what is wrong with one that is not."""
        try:
            return cls.model_validate_json(raw)
        except ValidationError as error:
            raise MalformedMessage(f"The controller's board is malformed: {problems(error)}") from None

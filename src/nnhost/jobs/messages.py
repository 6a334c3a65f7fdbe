"""The messages between the API processes and the controller: commands and their answers.

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

What is read was written by another process: these are untrusted, and a
malformed one is refused with `MalformedMessage` (a `ValueError`) saying
what is wrong. This module is a leaf: it must never import the controller,
the database or HTTP, so that either side may import it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .update import JobId


class MalformedMessage(ValueError):
    """A command or an answer that is not one: ``str()`` says what is wrong with it."""


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

#: The HTTP statuses a refusal may carry (an error's, never a success's).
RefusalCode = Annotated[int, Field(ge=400, le=599)]


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

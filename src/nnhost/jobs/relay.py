"""Between the API processes and the controller: in one process, or through the database.

`InProcessLink` is the `front.ControllerLink` of ``role = "all"``: the front
calls the controller's `JobService` directly, on the same event loop.

With separate processes (``role = "api"`` and ``"controller"``), they share
the database, the result store and the event bus (for the websockets' updates):

- An API process stores a job as RECEIVED with its payload and calls the
  controller on the event bus (`WAKE`); the controller's `Relay` then looks for
  new RECEIVED jobs and queues them. It also looks every `INTAKE_EVERY`
  seconds, so a lost call only delays a job.
- Cancelling, deploying and evicting are rows of ``commands``, which the
  controller carries out (`controls`) and answers in the same row; an API
  process waits up to `ANSWER_WITHIN` seconds for the answer (`DatabaseLink`).
  A command is durable: one sent while controllers change hands is carried
  out by the next.
- The controller publishes its board (`board`) every `PUBLISH_EVERY` seconds;
  an API process reads it, and marks it stale when no controller has
  published for `STALE_AFTER` seconds (or what it published cannot be read).

What is read back from the database was written by another process: it is
checked like any untrusted input before it is used, in one place for each
kind (`messages.parse_command` for a command row, `messages.read_answer` for
its answer, `messages.Board.read` for the board; in one process the board is
checked the same way, `messages.Board.of`). This module moves messages; it must never decide what a command
does (`controls`) nor speak HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Optional

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import RowMapping

from ..db import Database
from ..db.tables import commands, shared_values
from ..storage.blocking import run_blocking
from .bus import EventBus
from .front import Refused
from .job import Job, Status
from .messages import (
    Board,
    Cancel,
    Command,
    Done,
    MalformedMessage,
    Refusal,
    Result,
    answer_text,
    command_row,
    parse_command,
    read_answer,
)
from .service import JobService

log = logging.getLogger("nnhost.relay")

INTAKE_EVERY = 0.25
#: How often an API process looks for the controller's answer to its command.
ANSWER_POLL = 0.05
#: The bus name the controller listens on for "something new is in the database".
WAKE = "nnhost-controller-wake"
PUBLISH_EVERY = 1.0
STALE_AFTER = 10.0
ANSWER_WITHIN = 15.0
#: Answered commands are kept this long (for an API process that was slow to read its answer).
KEEP_ANSWERS = 3600.0
BOARD = "board"


class InProcessLink:
    """The controller is this process's own job service."""

    def __init__(self, service: JobService, board: Callable[[], dict[str, Any]]) -> None:
        self.service = service
        #: The controller's board as JSON data (`board.board`).
        self._board = board

    def accepted(self, job: Job) -> None:
        # After the reply, not before it: the job is stored, so RECEIVED can go
        # out now, and queueing and dispatch (a database write, the hand-off to
        # a job process) then overlap with the client reading it instead of
        # delaying it. Same loop, same order of jobs: call_soon is FIFO.
        asyncio.get_running_loop().call_soon(self.service.accept, job)

    async def cancel(self, job: Job) -> bool:
        return self.service.cancel(job)

    async def command(self, command: Command) -> Result:
        from .controls import carry_out

        return await carry_out(self.service, command)

    def board(self) -> Board:
        return Board.of(self._board())


def _answer(raw: str, command: Command) -> Result:
    """A command's answer as the controller wrote it: its result, or `Refused`."""
    try:
        answer = read_answer(raw, command)
    except MalformedMessage as error:
        log.warning("%s", error)
        raise Refused(502, "The controller's answer could not be read.") from None
    if isinstance(answer, Refusal):
        raise Refused(*answer.refused)
    return answer


class DatabaseLink:
    """The controller is another process: commands and its board go through the database."""

    def __init__(self, database: Database, bus: Optional[EventBus] = None) -> None:
        self.database = database
        self.bus = bus
        self._board: Optional[Board] = None

    def _wake(self) -> None:
        if self.bus is not None:
            self.bus.publish(WAKE, "new")

    def accepted(self, job: Job) -> None:
        self._wake()  # the controller also looks by itself (`Relay.intake`)

    async def cancel(self, job: Job) -> bool:
        # Recorded, not awaited: the controller cancels it as soon as it reads the row,
        # and a job that ends first is simply not cancelled.
        await run_blocking(self._send, Cancel(job_id=job.id))
        self._wake()
        return True

    async def command(self, command: Command) -> Result:
        command_id = await run_blocking(self._send, command)
        self._wake()
        deadline = time.monotonic() + ANSWER_WITHIN
        while time.monotonic() < deadline:
            raw = await run_blocking(self._result, command_id)
            if raw is not None:
                return _answer(raw, command)
            await asyncio.sleep(ANSWER_POLL)
        raise Refused(
            503,
            f"The controller did not answer within {ANSWER_WITHIN:.0f}s (is one running? "
            "see /status). The request is kept and is carried out when a controller reads it.",
        )

    def _send(self, command: Command) -> int:
        kind, args = command_row(command)
        with self.database.write() as db:
            result = db.execute(
                insert(commands).values(kind=kind, args=args, created_at=time.time())
            )
            key = result.inserted_primary_key
            assert key is not None  # an INSERT into a table with an integer key always has one
            return int(key[0])

    def _result(self, command_id: int) -> Optional[str]:
        query = select(commands.c.result).where(commands.c.id == command_id,
                                                commands.c.done_at.is_not(None))
        with self.database.read() as db:
            return db.execute(query).scalar()

    async def refresh_board(self) -> None:
        """Read the board the controller last published, off the event loop."""
        self._board = await run_blocking(read_board, self.database)

    async def keep_board_fresh(self) -> None:
        """Re-read the board twice per publishing period (the API process runs this as a task)."""
        while True:
            await self.refresh_board()
            await asyncio.sleep(PUBLISH_EVERY / 2)

    def board(self) -> Board:
        """The board as last read by `keep_board_fresh`: no database call, so safe on the loop."""
        if self._board is None:
            return Board(stale=True)  # nothing read yet: say so rather than block to read
        return self._board


def read_board(database: Database) -> Board:
    """The board the controller last published; ``stale`` when it is old, missing or unreadable."""
    query = select(shared_values.c.value, shared_values.c.updated_at).where(
        shared_values.c.name == BOARD
    )
    with database.read() as db:
        row = db.execute(query).first()
    board, readable = Board(), False
    if row is not None:
        try:
            board, readable = Board.read(row[0]), True
        except MalformedMessage as error:
            log.warning("%s; shown as stale until one can be read", error)
    age = time.time() - row[1] if row is not None else None
    return board.model_copy(update={
        "stale": not readable or age is None or age > STALE_AFTER,
        "published_seconds_ago": None if age is None else round(age, 1),
    })


class Relay:
    """The controller's side: take new jobs and commands, publish the board."""

    def __init__(self, service: JobService, database: Database, board: Callable[[], dict[str, Any]],
                 taken: Optional[set[str]] = None, bus: Optional[EventBus] = None) -> None:
        self.service = service
        self.database = database
        self._board = board
        #: RECEIVED jobs already queued (recovery's, and the ones intake found).
        self._taken = set(taken or ())
        self.bus = bus

    async def intake(self) -> int:
        """Queue the jobs API processes have stored since the last look.

        Each payload is copied from the database to this machine's spool in a
        thread first: a large one must not hold up the event loop when the job is
        dispatched (which would otherwise read it there).
        """
        if not self.service.may_act():
            return 0
        received = await run_blocking(self.service.store.with_status, (Status.RECEIVED,))
        self._taken &= {job.id for job in received}
        taken = 0
        for job in received:
            # A job this controller holds is newer than its row (cancelled, say).
            if job.id in self._taken or self.service.recorder.job(job.id) is not None:
                continue
            self._taken.add(job.id)
            if job.deployment not in self.service.deployments.deployments:
                self.service.reject(job, (
                    f"This server's controller does not serve {job.deployment}; its API "
                    "and controller processes have different catalogs. Tell the operator."
                ))
                continue
            try:
                await run_blocking(self.service.payloads.fetch_to_file, job.id)
            except (OSError, ValueError):
                pass  # dispatching reads it again, and fails the job saying so
            self.service.accept(job)
            taken += 1
        return taken

    async def carry_out_commands(self) -> int:
        from .controls import carry_out

        if not self.service.may_act():
            return 0
        for row in (pending := await run_blocking(self._pending)):
            answer: Done | Refusal
            try:
                command = parse_command(row["kind"], row["args"])
                answer = Done(ok=(await carry_out(self.service, command)).model_dump())
            except Refused as refusal:
                answer = Refusal(refused=(refusal.code, refusal.detail))
            except MalformedMessage as error:
                answer = Refusal(refused=(400, f"{error}."))
            except Exception as error:
                log.exception("command %s (%s) failed", row["id"], row["kind"])
                answer = Refusal(refused=(500, f"The controller failed to carry it out: {error}."))
            await run_blocking(self._answer, row["id"], answer_text(answer))
        return len(pending)

    def _pending(self) -> list[RowMapping]:
        """Blocking: the commands not yet carried out, oldest first."""
        query = select(commands).where(commands.c.done_at.is_(None)).order_by(commands.c.id)
        with self.database.read() as db:
            return list(db.execute(query).mappings())

    def _answer(self, command_id: int, answer: str) -> None:
        """Blocking: the command is done, and this is its answer."""
        with self.database.write() as db:
            db.execute(update(commands).where(commands.c.id == command_id)
                       .values(done_at=time.time(), result=answer))

    def publish(self, board: dict[str, Any]) -> None:
        """Publish ``board`` (`board.board`'s JSON data), checked first: a malformed one
        raises `MalformedMessage` here rather than in every API process that reads it."""
        now = time.time()
        value = Board.of(board).text()
        with self.database.write() as db:
            done = db.execute(update(shared_values).where(shared_values.c.name == BOARD)
                              .values(value=value, updated_at=now))
            if done.rowcount == 0:
                db.execute(insert(shared_values).values(name=BOARD, value=value, updated_at=now))
            db.execute(delete(commands).where(commands.c.done_at < now - KEEP_ANSWERS))

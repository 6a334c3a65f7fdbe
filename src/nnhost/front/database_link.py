"""The API process's link to a controller in another process, through the database.

With separate processes (``role = "api"`` and ``"controller"``) an API
process reaches the controller only through what they share: the database
and the event bus. `DatabaseLink` is the `jobs.ControllerLink` for that case;
the controller's side is `controller.relay.Relay`.

- A stored job needs nothing more than a call on the bus (`messages.WAKE`):
  the controller reads new RECEIVED rows itself, and also without a call.
- Cancelling, deploying and evicting are rows of ``commands``; the API
  process waits up to `ANSWER_WITHIN` seconds for the controller to write
  its answer into the row. A command is durable: one sent while controllers
  change hands is carried out by the next.
- The board the controller publishes is read by a task of its own
  (`keep_board_fresh`), never by a request; it is stale when no controller
  has published for `STALE_AFTER` seconds, or what it published cannot be
  read.

What is read back was written by another process: it is checked like any
untrusted input before it is used (`messages.read_answer` for an answer,
`messages.Board.read` for the board). Every database call runs off the event
loop. This module must never decide what a command does, nor run a job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from sqlalchemy import insert, select

from ..db import Database
from ..db.tables import commands, shared_values
from ..jobs.bus import EventBus
from ..jobs.job import Job
from ..jobs.messages import (
    BOARD,
    PUBLISH_EVERY,
    WAKE,
    Board,
    Cancel,
    Command,
    MalformedMessage,
    Refusal,
    Refused,
    Result,
    command_row,
    read_answer,
)
from ..storage.blocking import run_blocking

log = logging.getLogger("nnhost.relay")

#: How often an API process looks for the controller's answer to its command.
ANSWER_POLL = 0.05
ANSWER_WITHIN = 15.0
STALE_AFTER = 10.0


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

"""The controller's side of its link with the API processes.

`InProcessLink` is the `front.jobs.ControllerLink` of ``role = "all"``: the
front calls the controller's `JobService` directly, on the same event loop.

With separate processes (``role = "api"`` and ``"controller"``) the API side
is `front.database_link.DatabaseLink`, and `Relay` is this side of it:

- An API process stores a job as RECEIVED with its payload and calls the
  controller on the event bus (`messages.WAKE`); `Relay.intake` then looks
  for new RECEIVED jobs and queues them. It also looks every `INTAKE_EVERY`
  seconds, so a lost call only delays a job.
- Cancelling, deploying and evicting are rows of ``commands``:
  `Relay.carry_out_commands` reads each with `messages.parse_command`, has
  `controls` carry it out and writes the answer into the same row. A command
  is durable: one sent while controllers change hands is carried out by the
  next. Answers are kept `KEEP_ANSWERS` seconds.
- `Relay.publish` writes the board (`board`) every `messages.PUBLISH_EVERY`
  seconds for the API processes to read.

This module moves messages; it must never decide what a command does
(`controls`) nor speak HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import RowMapping

from ..db import Database
from ..db.tables import commands, shared_values
from ..jobs.bus import EventBus
from ..jobs.job import Job, Status
from ..jobs.messages import (
    BOARD,
    Board,
    Command,
    Done,
    MalformedMessage,
    Refusal,
    Refused,
    Result,
    answer_text,
    parse_command,
)
from ..storage.blocking import run_blocking
from .controls import carry_out
from .service import JobService

log = logging.getLogger("nnhost.relay")

#: How often the controller looks for new jobs when no API process called.
INTAKE_EVERY = 0.25
#: Answered commands are kept this long (for an API process that was slow to read its answer).
KEEP_ANSWERS = 3600.0


class InProcessLink:
    """The controller is this process's own job service."""

    def __init__(self, service: JobService, board: Callable[[], Board]) -> None:
        self.service = service
        #: The controller's board (`board.board`).
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
        return await carry_out(self.service, command)

    def board(self) -> Board:
        return self._board()


class Relay:
    """The controller's side: take new jobs and commands, publish the board."""

    def __init__(self, service: JobService, database: Database, board: Callable[[], Board],
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

    def publish(self, board: Board) -> None:
        """Publish ``board`` (`board.board`) for the API processes to read."""
        now = time.time()
        value = board.text()
        with self.database.write() as db:
            done = db.execute(update(shared_values).where(shared_values.c.name == BOARD)
                              .values(value=value, updated_at=now))
            if done.rowcount == 0:
                db.execute(insert(shared_values).values(name=BOARD, value=value, updated_at=now))
            db.execute(delete(commands).where(commands.c.done_at < now - KEEP_ANSWERS))

"""The controller lease and the relay between API processes and a controller, in-process.

Real databases (SQLite and PostgreSQL), fake replicas (tests/fakes.py): an API
side (`JobFront` with a `DatabaseLink`) and a controller side (`JobService`
with a `Relay`) that meet only through the database, as separate processes do.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from pydantic import ValidationError
from sqlalchemy import insert, update
from test_service_inprocess import ADA, World, spec

from nnhost.controller.board import board
from nnhost.controller.lease import Lease
from nnhost.controller.relay import Relay
from nnhost.db import connect
from nnhost.db.tables import commands
from nnhost.front.database_link import DatabaseLink, read_board
from nnhost.front.jobs import JobFront, Submission
from nnhost.jobs.job import Status
from nnhost.jobs.messages import Board, Refused
from nnhost.storage.blobs import BlobDir
from nnhost.storage.payloads import DatabasePayloads


def test_one_controller_holds_the_lease_and_a_standby_takes_it_when_it_lapses(database_url):
    database = connect(database_url)
    try:
        first, second = Lease(database, ttl=0.5), Lease(database, ttl=0.5)
        assert first.try_acquire() and not second.try_acquire()
        assert first.renew() and first.current().holder == first.holder
        time.sleep(0.6)  # the first stopped renewing: its lease lapsed
        assert second.try_acquire()
        assert not first.renew()  # it must stop acting now
        assert not first.try_acquire()
        second.release()
        assert second.current() is None and first.try_acquire()
    finally:
        database.close()


def test_two_standbys_racing_for_a_new_lease_get_one_holder(database_url):
    database = connect(database_url)
    try:
        contenders = [Lease(database) for _ in range(6)]

        async def race():
            return await asyncio.gather(*(asyncio.to_thread(c.try_acquire) for c in contenders))

        assert sum(asyncio.run(race())) == 1
    finally:
        database.close()


class Split:
    """An API process's front and a controller's relay over one database."""

    def __init__(self, world: World, tmp_path) -> None:
        database = world.connection
        self.world = world
        world.jobs.payloads = DatabasePayloads(database, BlobDir(tmp_path / "spool", ".payload"))
        self.front = JobFront(world.store, world.bus, DatabasePayloads(
            database, BlobDir(tmp_path / "api-spool", ".payload")), world.catalog,
            link=DatabaseLink(database))
        self.relay = Relay(world.jobs, database, lambda: board(world.jobs))

    async def submit(self, name: str) -> str:
        key = next(s for s in self.world.catalog if s.name == name).model_key()
        job = await self.front.submit(ADA, Submission(key, "", False, {}), b"payload", "http://x")
        return job.id


def test_a_job_stored_by_an_api_process_is_found_queued_and_run_by_the_controller(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        split = Split(world, tmp_path)
        job_id = await split.submit("org/a")
        assert world.status(job_id) is Status.RECEIVED  # nothing acts until the relay looks
        assert await split.relay.intake() == 1 and await split.relay.intake() == 0
        await world.settle()  # the rows are written off the loop
        replica = world.replica("org/a")
        assert replica.ran == [job_id] and world.status(job_id) is Status.DISPATCHED
        assert world.store.get(job_id).started_at is not None  # it may run from now on
        assert (tmp_path / "spool" / f"{job_id}.payload").read_bytes() == b"payload"
        replica.run()
        replica.complete(b"r")
        await world.settle()
        assert world.status(job_id) is Status.COMPLETED
        # The payload is gone from the database and the spool once the job ended.
        assert not world.jobs.payloads.exists(job_id)
        assert not (tmp_path / "spool" / f"{job_id}.payload").exists()

    asyncio.run(body())


async def sent(database) -> None:
    """Until an API process's command row is in the database (written off its loop, in a thread)."""
    while True:
        with database.read() as db:
            if db.execute(commands.select().where(commands.c.done_at.is_(None))).first() is not None:
                return
        await asyncio.sleep(0.01)


def test_commands_go_through_the_database_and_refusals_keep_their_status(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a"), spec("org/b")]).start()
        split = Split(world, tmp_path)

        async def ask(kind, **args):
            asked = asyncio.create_task(split.front.command(kind, **args))
            sending = asyncio.create_task(sent(world.connection))
            await asyncio.wait([asked, sending], return_when=asyncio.FIRST_COMPLETED)
            sending.cancel()  # a command refused before it is sent has no row to wait for
            await split.relay.carry_out_commands()
            return await asked

        assert (await ask("evict", model="org/b"))["target"] == "COLD"
        with pytest.raises(Refused) as refused:
            await ask("deploy", model="org/nope")
        assert refused.value.code == 404 and "org/nope" in refused.value.detail
        with pytest.raises(Refused) as refused:
            await ask("reboot")
        assert refused.value.code == 400

        job_id = await split.submit("org/a")
        await split.relay.intake()
        assert await split.front.cancel(world.store.get(job_id))
        await split.relay.carry_out_commands()
        await world.settle()
        assert world.replica("org/a").cancelled == [job_id]  # it was running: its replica stops it

    asyncio.run(body())


def test_what_the_database_holds_is_checked_before_the_controller_acts_on_it(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        split = Split(world, tmp_path)
        database = world.connection
        with database.write() as db:
            for args in ("[1, 2]", "{not json", json.dumps({"model": "org/a", "bogus": 1})):
                db.execute(insert(commands).values(kind="evict", args=args, created_at=time.time()))
        assert await split.relay.carry_out_commands() == 3
        with database.read() as db:
            answers = [json.loads(row.result) for row in db.execute(commands.select())]
        assert all(answer["refused"][0] == 400 for answer in answers)
        assert world.deployments.get("org/a").target == "HOT"  # none of them acted

    asyncio.run(body())


def test_an_answer_the_api_process_cannot_read_is_a_502_not_a_crash(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        split = Split(world, tmp_path)
        for forged in ("{not json", json.dumps({"ok": {"model": "org/a"}}),
                       json.dumps({"refused": [200, "fine"]})):
            asked = asyncio.create_task(split.front.command("evict", model="org/a"))
            await sent(world.connection)  # the command's row is written; the controller forges its answer
            with world.connection.write() as db:
                db.execute(update(commands).where(commands.c.done_at.is_(None))
                           .values(done_at=time.time(), result=forged))
            with pytest.raises(Refused) as refused:
                await asked
            assert refused.value.code == 502 and "could not be read" in refused.value.detail
        assert world.deployments.get("org/a").target == "HOT"  # nothing carried it out

    asyncio.run(body())


def test_api_processes_see_the_published_board_and_when_it_goes_stale(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        split = Split(world, tmp_path)
        assert read_board(world.connection).stale  # nothing published yet
        split.relay.publish(board(world.jobs))
        published = read_board(world.connection)
        assert not published.stale and [model.name for model in published.models] == ["org/a"]
        with world.connection.write() as db:
            from nnhost.db.tables import shared_values

            db.execute(update(shared_values).values(updated_at=time.time() - 60))
        assert read_board(world.connection).stale

    asyncio.run(body())


def test_a_board_that_cannot_be_read_is_shown_as_stale_and_none_is_published(tmp_path, caplog):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        split = Split(world, tmp_path)
        split.relay.publish(board(world.jobs))
        from nnhost.db.tables import shared_values

        forged = json.loads(read_board(world.connection).text())
        forged["models"][0]["queued"] = "many"
        forged["devices"] = {"cpu": {"budget_bytes": 1}}
        for value in ("{not json", "[]", json.dumps(forged)):
            with world.connection.write() as db:
                db.execute(update(shared_values).values(value=value, updated_at=time.time()))
            shown = read_board(world.connection)
            assert shown.stale and shown.models == [] and shown.deployments == {}
        assert "models.0.queued" in caplog.text and "devices.cpu.used_bytes" in caplog.text
        # The controller cannot even make a board that is not one, let alone publish it.
        with pytest.raises(ValidationError, match="models.0"):
            Board(models=[{"name": "org/a"}])

    asyncio.run(body())


@pytest.mark.parametrize("api_key", [None, "nnh_" + "k" * 40])
def test_processes_starting_together_on_a_new_database_make_one_admin(database_url, api_key):
    from concurrent.futures import ThreadPoolExecutor

    from nnhost.app import ensure_admin
    from nnhost.auth.keys import KeyStore

    databases = [connect(database_url) for _ in range(6)]
    try:
        with ThreadPoolExecutor(len(databases)) as pool:
            shown = list(pool.map(lambda db: ensure_admin(KeyStore(db), api_key), databases))
        keys = KeyStore(databases[0])
        assert keys.user_count() == 1
        if api_key:
            assert shown == [None] * 6 and keys.has_key(api_key)
        else:
            assert len([key for key in shown if key]) == 1  # one key, shown once
    finally:
        for database in databases:
            database.close()


def test_a_controller_whose_lease_is_not_fresh_hands_out_nothing(tmp_path):
    async def body():
        world = await World(tmp_path, [spec("org/a")]).start()
        split = Split(world, tmp_path)
        acting = False
        world.jobs.may_act = lambda: acting
        job_id = await split.submit("org/a")
        assert await split.relay.intake() == 0 and world.status(job_id) is Status.RECEIVED
        acting = True  # renewed: it acts again, and the job moves
        assert await split.relay.intake() == 1
        assert world.replica("org/a").ran == [job_id]
        second = await split.submit("org/a")
        acting = False
        await split.relay.intake()  # stale again: queued is as far as it goes
        world.replica("org/a").run()
        world.replica("org/a").complete(b"r")
        await world.settle()
        assert world.status(second) is Status.RECEIVED
        acting = True
        await split.relay.intake()
        world.jobs.pump_waiting()
        assert world.replica("org/a").ran == [job_id, second]

    asyncio.run(body())


def test_a_recovered_job_is_dispatched_without_reading_the_database_on_the_loop(tmp_path):
    """A controller taking over finds a job whose payload only the database holds: recovery
    copies it to this machine in a thread, so that dispatching it reads no database on the loop."""

    async def body():
        world = World(tmp_path, [spec("org/a")])
        split = Split(world, tmp_path)
        world.jobs.upkeep.payloads = world.jobs.payloads  # the controller's, as the split gives it
        job_id = await split.submit("org/a")  # stored by an API process; no controller took it
        loop_thread = threading.get_ident()
        on_loop: list[str] = []
        database = world.connection

        def watch(name):
            method = getattr(database, name)

            def watched(*args, **kwargs):
                if threading.get_ident() == loop_thread:
                    on_loop.append(name)
                return method(*args, **kwargs)

            setattr(database, name, watched)

        watch("read")
        watch("write")
        assert await world.jobs.recover() == [job_id]
        await world.start()
        await world.settle()
        assert world.replica("org/a").ran == [job_id]
        assert on_loop == [], f"database calls on the controller's loop: {on_loop}"
        assert (tmp_path / "spool" / f"{job_id}.payload").read_bytes() == b"payload"

    asyncio.run(body())

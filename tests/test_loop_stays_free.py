"""A slow store holds one thread, never the event loop.

The API's routes and `JobFront` call the job, key and payload stores through
`storage.blocking.run_blocking`, so while one submit waits on a stuck
database, the same process still answers everyone else. Shown without a
clock: the store's call blocks on an event that the test sets only after the
loop has answered another request (over the real routes, in this loop, through
httpx's ASGI transport). Were the call made on the loop, that answer could not
come first: the blocked call gives up after a while, and the test sees that it
was not the one that let it go.

Also: each result store's loop side (`on_loop`) is an `AsyncResultStore` whose
I/O methods are coroutines.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from nnhost.api import protocol
from nnhost.api.deps import API_KEY_HEADER
from nnhost.api.server import Server
from nnhost.auth.access import Access
from nnhost.auth.accounts import Accounts
from nnhost.auth.keys import KeyStore
from nnhost.config import Settings
from nnhost.front.jobs import JobFront
from nnhost.jobs.bus import LocalEventBus
from nnhost.jobs.job import Job, Status
from nnhost.jobs.messages import Board
from nnhost.jobs.store import JobStore, connect
from nnhost.models.catalog import Catalog, ModelSpec
from nnhost.storage.blobs import BlobDir
from nnhost.storage.blocking import run_blocking
from nnhost.storage.links import LinkSigner
from nnhost.storage.results import AsyncResultStore, DirectoryStore, ResultStore
from nnhost.storage.s3 import S3Store
from nnhost.telemetry.metrics import Metrics

#: Only a guard against a hang: nothing here is timed.
GIVE_UP = 60.0


class Stuck:
    """One method of a store that blocks its caller until the test lets it go."""

    def __init__(self, call):
        self.call = call
        self.entered = threading.Event()
        self.release = threading.Event()
        self.let_go = False  # whether `release` was set (rather than waited out)

    def __call__(self, *args, **kwargs):
        self.entered.set()
        self.let_go = self.release.wait(GIVE_UP)
        return self.call(*args, **kwargs)


class Never:
    """A controller link that only notes what it is given (no controller runs here)."""

    def __init__(self):
        self.accepted_jobs = []

    def accepted(self, job):
        self.accepted_jobs.append(job.id)

    async def cancel(self, job):
        return False

    async def command(self, kind, **args):
        return {}

    def board(self):
        return Board(stale=True)


def build(tmp_path: Path, stuck: str):
    settings = Settings(data_dir=tmp_path)
    database = connect(tmp_path / "nnhost.sqlite3")
    keys = KeyStore(database)
    user_id = keys.add_user("ada@example.org")
    key = keys.create_key(user_id)
    store = JobStore(database)
    payloads = BlobDir(tmp_path / "payloads", ".payload")
    blocked = Stuck(store.create if stuck == "job store" else payloads.write)
    if stuck == "job store":
        store.create = blocked
    else:
        payloads.write = blocked
    spec = ModelSpec(repo_id="org/model", size_bytes=1 << 20)
    catalog = Catalog([spec])
    link = Never()
    signer = LinkSigner(b"test")
    bus = LocalEventBus()
    access = Access(settings, keys, local_admin_email="admin@localhost",
                    unfinished_jobs=store.unfinished_count)
    front = JobFront(store, bus, payloads, catalog, link)
    server = Server(settings, catalog, keys, bus, DirectoryStore(tmp_path / "results", signer),
                    signer, front, access=access, accounts=Accounts(settings, database, keys, access),
                    metrics=Metrics(front.board, lambda: len(bus), [spec.name]))
    app = FastAPI()
    app.include_router(protocol.router)
    app.state.server = server
    earlier = Job(id="e" * 32, user_id=user_id, model_key=spec.model_key(), deployment=spec.name)
    JobStore.create(store, earlier)  # the store's own method: this one does not block
    return app, key, spec, blocked, link, database, earlier


@pytest.mark.parametrize("stuck", ["job store", "payload store"])
def test_a_submit_stuck_in_a_store_leaves_the_loop_answering_others(tmp_path, stuck):
    app, key, spec, blocked, link, database, earlier = build(tmp_path, stuck)
    headers = {API_KEY_HEADER: key}
    envelope = json.dumps({"model_key": spec.model_key()})

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://nnhost") as client:
            submit = asyncio.create_task(client.post(
                "/request", headers=headers, data={"data": envelope},
                files={"blob": ("blob", b"the payload", "application/octet-stream")},
            ))
            # Waited for off the loop, so the submit runs up to its stuck call meanwhile.
            assert await run_blocking(blocked.entered.wait, GIVE_UP)
            # The submit is stuck in its store call; another request is answered now.
            answer = await client.get(f"/response/{earlier.id}", headers=headers)
            assert answer.status_code == 200
            assert answer.json()["id"] == earlier.id
            assert answer.json()["status"] == Status.RECEIVED.value
            assert not submit.done() and not blocked.let_go
            blocked.release.set()
            reply = await submit
        return reply

    try:
        reply = asyncio.run(scenario())
    finally:
        blocked.release.set()
        database.close()
    assert blocked.let_go, "the stuck call was not let go by the test: it blocked the loop"
    assert reply.status_code == 200, reply.text
    job_id = reply.json()["id"]
    assert reply.json()["status"] == Status.RECEIVED.value
    assert link.accepted_jobs == [job_id]


@pytest.mark.parametrize("kind", [DirectoryStore, S3Store])
def test_each_result_store_has_a_loop_side_whose_io_is_async(tmp_path, kind):
    if kind is DirectoryStore:
        store = DirectoryStore(tmp_path / "results", LinkSigner(b"test"))
    else:
        store = S3Store("s3://bucket/prefix", endpoint="http://127.0.0.1:9", spool=tmp_path / "spool",
                        client=object())
    assert isinstance(store, ResultStore)
    on_loop: AsyncResultStore = store.on_loop()
    assert on_loop.store is store
    for name in ("commit", "write", "open", "read", "size", "exists", "delete", "expire"):
        assert inspect.iscoroutinefunction(getattr(on_loop, name)), name
        assert not inspect.iscoroutinefunction(getattr(store, name)), name
    for name in ("staging_path", "signed_url", "run_then"):
        assert not inspect.iscoroutinefunction(getattr(on_loop, name)), name
    assert not hasattr(store, "remote")


def test_the_loop_side_of_a_directory_stores_in_place_and_s3s_in_a_thread(tmp_path):
    directory = DirectoryStore(tmp_path / "results", LinkSigner(b"test"))
    directory.staging_path("j1").write_bytes(b"result")
    answers = []
    assert directory.on_loop().run_then(lambda store: store.commit("j1"), answers.append) is None
    assert answers == [6]  # done as the call returned: no loop was needed

    s3 = S3Store("s3://bucket/prefix", endpoint="http://127.0.0.1:9", spool=tmp_path / "spool",
                 client=object())
    caller = threading.get_ident()
    threads = []

    async def scenario():
        task = s3.on_loop().run_then(lambda store: threading.get_ident(), threads.append)
        assert task is not None and not threads
        await task

    asyncio.run(scenario())
    assert len(threads) == 1 and threads[0] != caller

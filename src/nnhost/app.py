"""The composition root: build every part of the server and wire them together.

Nothing else constructs the store, the bus, the job front, the controller or
the result store; they receive each other here. What this process builds
depends on its role (``role`` in the settings):

- ``all`` (the default): one process serves the API and is the controller
  (`controller.loop.Controller`), which the front reaches directly.
- ``api``: the routes, websockets and results only; the front reaches the
  controller through the database (`front.database_link.DatabaseLink`) and never runs
  a model. Any number of these may share one database, bus and result store.
- ``controller``: the queue, the deployments and the replicas, once it holds
  the controller lease (`controller.loop.run_controller`); it serves only
  /ping, /status, /env, /whoami and /metrics on its own port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional, Sequence

from fastapi import FastAPI

from .api.server import Server
from .auth.access import Access, settings_problem
from .auth.accounts import Accounts
from .auth.keys import LOCAL_ADMIN_EMAIL, KeyStore
from .config import Settings
from .controller.lease import Lease
from .controller.relay import InProcessLink
from .db import connect
from .front.database_link import DatabaseLink
from .front.jobs import JobFront
from .jobs.bus import EventBus, LocalEventBus
from .jobs.store import JobStore
from .models.adapters import find_adapter
from .models.catalog import Catalog, ModelSpec
from .models.hfcache import find_snapshot
from .storage.blobs import BlobDir
from .storage.blocking import run_blocking
from .storage.choice import open_result_store
from .storage.links import LinkSigner
from .storage.payloads import DatabasePayloads
from .storage.results import ResultStore
from .telemetry.metrics import Metrics

if TYPE_CHECKING:
    from .controller.loop import Controller

log = logging.getLogger("nnhost")

ADMIN_EMAIL = LOCAL_ADMIN_EMAIL


def parse_model(text: str) -> ModelSpec:
    """``org/name`` or ``org/name@revision`` from the command line."""
    repo_id, _, revision = text.partition("@")
    return ModelSpec(repo_id=repo_id, revision=revision or None)


def build_catalog(settings: Settings, extra: Sequence[ModelSpec] = ()) -> Catalog:
    """The models served: nnhost.toml's ``[[model]]`` tables, then the command line's.

    Each model's size is read from its checkpoint's headers (never its weights)
    when it is in the cache, plus the configured margin.
    """
    specs = [entry.spec() for entry in settings.catalog]
    for spec in extra:
        if not any(s.name == spec.name for s in specs):
            specs.append(spec)
    for spec in specs:
        if spec.trust_remote_code and not settings.allow_trust_remote_code:
            raise ValueError(
                f"{spec.repo_id} needs trust_remote_code, which runs code from the model "
                "repository; set allow_trust_remote_code = true in nnhost.toml to permit it."
            )
        snapshot = find_snapshot(spec.repo_id, spec.revision, settings.hf_home)
        if snapshot is not None and spec.size_bytes is None:
            spec.measure(snapshot, settings.memory_margin)
    allowed = [entry.rule() for entry in settings.allow]
    for rule in allowed:
        if rule.trust_remote_code and not settings.allow_trust_remote_code:
            raise ValueError(
                f"[[allow]] {rule.repo_id!r} permits trust_remote_code, which runs code from "
                "model repositories; set allow_trust_remote_code = true in nnhost.toml to permit it."
            )
    return Catalog(specs, allowed)


def ensure_admin(keys: KeyStore, api_key: Optional[str]) -> Optional[str]:
    """Make sure someone can use a new server; returns a newly made key to show once.

    Several processes (API processes, controllers) may start on one new database
    at once: whichever makes the admin first wins, and the others use theirs.
    """
    from sqlalchemy.exc import IntegrityError

    from .auth.keys import UserExists

    admin = keys.user_by_email(ADMIN_EMAIL)
    if api_key:
        if admin is None:
            try:
                admin_id = keys.add_user(ADMIN_EMAIL, ("admin",))
            except UserExists:
                admin = keys.user_by_email(ADMIN_EMAIL)
                assert admin is not None
                admin_id = admin.user_id
        else:
            admin_id = admin.user_id
        if not keys.has_key(api_key):
            try:
                keys.create_key(admin_id, name="--api-key", key=api_key)
            except IntegrityError:
                if not keys.has_key(api_key):
                    raise
        return None
    if keys.user_count() == 0:
        try:
            admin_id = keys.add_user(ADMIN_EMAIL, ("admin",))
        except UserExists:
            return None  # another process made the admin, and showed its key
        return keys.create_key(admin_id, name="first start")
    return None


def prepare_admin_key(settings: Settings) -> Optional[str]:
    """Before serving: make the admin's first key if there is nobody yet (shown once)."""
    database = connect(settings.database_url)
    try:
        return ensure_admin(KeyStore(database), settings.api_key)
    finally:
        database.close()


def make_bus(settings: Settings) -> EventBus:
    """In-process by default; over Redis (``events = "redis://..."``) for several API processes."""
    if not settings.events:
        return LocalEventBus()
    from .jobs.bus_redis import RedisEventBus

    return RedisEventBus(settings.events)


def link_signer(settings: Settings) -> LinkSigner:
    """The result-link secret: this data directory's for one process; the shared
    database's when API processes (which check the links) are several."""
    if settings.role == "all":
        return LinkSigner.from_file(settings.data_dir / "secrets" / "link-signing.key")
    import secrets

    from .db.shared import get_or_create

    database = connect(settings.database_url)
    try:
        key = get_or_create(database, "link-signing-key", lambda: secrets.token_hex(32))
    finally:
        database.close()
    return LinkSigner(bytes.fromhex(key))


def build_result_store(settings: Settings) -> tuple[ResultStore, LinkSigner]:
    """The result store the settings name, checked (raises `ResultStoreError` saying what to fix)."""
    signer = link_signer(settings)
    results = open_result_store(
        str(settings.results_dir or settings.results),
        settings.results_endpoint,
        spool=settings.data_dir / "spool",
        signer=signer,
    )
    results.check()
    return results, signer


def create_app(settings: Settings, catalog: Catalog) -> FastAPI:
    from .api import account_pages, admin, admin_page, hub, ops, protocol, status_page
    from .api.middleware import RequestIds
    from .api.socketio_front import SocketIOFront
    from .controller.loop import build_controller, run_controller

    problem = settings_problem(settings)
    if problem:
        raise ValueError(problem)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    results, signer = build_result_store(settings)
    role = settings.role

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = connect(settings.database_url)
        keys = KeyStore(database)
        ensure_admin(keys, settings.api_key)
        store = JobStore(database)
        access = Access(
            settings, keys, local_admin_email=ADMIN_EMAIL, unfinished_jobs=store.unfinished_count
        )
        accounts = Accounts(settings, database, keys, access)
        bus = make_bus(settings)
        await bus.start()
        spool = BlobDir(settings.data_dir / "payloads", ".payload")
        payloads = spool if role == "all" else DatabasePayloads(database, spool)
        link = DatabaseLink(database, bus)
        front = JobFront(store, bus, payloads, catalog, link=link)
        metrics = Metrics(front.board, lambda: len(bus), [spec.name for spec in catalog])
        front.observers.add(metrics.jobs)
        server = Server(settings, catalog, keys, bus, results, signer, front,
                        access=access, accounts=accounts, metrics=metrics)
        #: This process's controller, once it acts (or stands by to).
        acting_controller: Optional[Controller] = None
        app.state.server = server

        def build() -> Controller:
            return build_controller(settings, catalog, store, bus, payloads, results,
                                    observers=[metrics.jobs], recent=metrics.jobs.recent)

        tasks: list[asyncio.Task[Any]] = []
        board_reader: Optional[asyncio.Task[None]] = None
        if role != "all":
            # An API process (or a standby) shows the published board; the database
            # is read by a task off the loop, never by the request that shows it.
            await link.refresh_board()
            board_reader = asyncio.create_task(link.keep_board_fresh())
            tasks.append(board_reader)

        def acting(controller: Controller) -> None:
            nonlocal acting_controller
            acting_controller = controller
            front.link = InProcessLink(controller.service, controller.board)
            if board_reader is not None:
                board_reader.cancel()  # this process makes the board now

        lease: Optional[Lease] = None
        if role == "all":
            controller = build()
            acting(controller)
            await controller.start()
        elif role == "controller":
            # Until it acts, a standby's /status shows the acting controller's board.
            lease = Lease(database)
            tasks.append(asyncio.create_task(run_controller(lease, database, build, acting)))
        # Result frames are torch.save'd; import torch now, off the loop, rather
        # than making the first user's COMPLETED wait for it.
        if role != "controller":
            tasks.append(asyncio.create_task(run_blocking(__import__, "torch")))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            if acting_controller is not None:
                await acting_controller.stop(settings.shutdown_grace)
            if lease is not None:
                await run_blocking(lease.release)
                log.info("gave up the controller lease")
            await bus.stop()
            database.close()

    app = FastAPI(title="nnhost", lifespan=lifespan, docs_url="/docs", redoc_url=None)

    def count_response(method: str, route: str, code: str) -> None:
        server = getattr(app.state, "server", None)
        if server is not None and server.metrics is not None:
            server.metrics.http.labels(method, route, code).inc()

    app.add_middleware(RequestIds, count=count_response)
    app.include_router(ops.router)
    if role == "controller":
        return app  # no requests, pages or results: those are the API processes'
    app.include_router(protocol.router)
    # Clients before 0.8 wait for their jobs' updates on a Socket.IO session.
    app.add_middleware(SocketIOFront, state=app.state)
    app.include_router(admin.router)
    app.include_router(status_page.router)
    app.include_router(admin_page.router)
    account_pages.install(app)

    def resolve(repo_id: str, revision: Optional[str]) -> Optional[Path]:
        # A served PEFT adapter too: the client reads its config to build its meta model.
        if not catalog.hosts_repo(repo_id) and find_adapter(repo_id, settings.hf_home) is None:
            return None
        return find_snapshot(repo_id, revision, settings.hf_home)

    app.include_router(
        hub.create_hub_router(resolve, serve_weights=settings.hub_serve_weights), prefix="/hub"
    )
    return app

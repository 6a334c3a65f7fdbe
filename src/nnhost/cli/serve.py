"""``nnhost serve`` and ``nnhost demo-model``: check the settings, then run the server.

Everything an operator can get wrong (settings, the database, the result
store, an unreachable Redis, a role without a shared bus) is found here and
reported in one line, with exit status 2, before anything starts serving.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

log = logging.getLogger("nnhost.serve")

if TYPE_CHECKING:
    from ..config import Settings
    from ..models.catalog import Catalog


def _print_welcome(
    url: str, key_line: str, example: str, catalog: Catalog, settings: Settings
) -> None:
    print(
        "\nnnhost is starting. In the shell where you run nnsight, paste:\n\n"
        f"    export NDIF_HOST={url}\n"
        f"{key_line}"
        f"    export HF_ENDPOINT={url}/hub\n\n"
        "Then, in Python:\n\n"
        "    from nnsight import LanguageModel\n"
        f"    model = LanguageModel({example!r})\n"
        "    with model.trace('The Eiffel Tower is in the city of', remote=True):\n"
        "        logits = model.lm_head.output.save()\n"
        "    print(model.tokenizer.decode(logits[0, -1].argmax()))\n\n"
        f"Serving: {', '.join(spec.name for spec in catalog) or 'no listed model'}"
        + (f"; fetched on request: {', '.join(r.describe() for r in catalog.allowed)}" if catalog.allowed else "")
        + f". Data: {settings.data_dir}\n",
        flush=True,
    )


def serve_command(args: argparse.Namespace) -> int:
    from ..config import load_settings
    from .flags import given

    settings = load_settings(
        {**given(args), "models": args.models or None},  # each flag that is a setting
        Path(args.config) if args.config else None,
    )
    from ..auth.access import settings_problem

    problem = settings_problem(settings)
    if problem:
        print(f"nnhost serve: {problem}", file=sys.stderr)
        return 2
    if settings.events:
        problem = _unreachable(settings.events)
        if problem:
            print(f"nnhost serve: events = {settings.events!r}: {problem}", file=sys.stderr)
            return 2
    from ..telemetry.logs import configure

    configure(settings.log_format, args.log_level)
    # Workers, the Hub mirror and the demo builder must agree on one model cache.
    os.environ.setdefault("HF_HOME", str(settings.hf_home))

    from ..app import build_catalog, create_app, parse_model, prepare_admin_key

    specs = [parse_model(text) for text in settings.models]
    if settings.demo:
        from ..models.demo import DEMO_REPO_ID, build_demo_model

        print(f"Preparing the demo model {DEMO_REPO_ID} ...", flush=True)
        build_demo_model(settings.hf_home, progress=lambda line: print(f"  {line}", flush=True))
        if not any(spec.repo_id == DEMO_REPO_ID for spec in specs):
            specs.append(parse_model(DEMO_REPO_ID))
    try:
        catalog = build_catalog(settings, specs)
    except ValueError as error:
        print(f"nnhost serve: {error}", file=sys.stderr)
        return 2
    if not list(catalog) and not catalog.allowed:
        print(
            "nnhost serve: name at least one model to serve (e.g. `nnhost serve "
            "openai-community/gpt2`, [[model]] or [[allow]] tables in nnhost.toml), or use --demo "
            "for the offline demo model.",
            file=sys.stderr,
        )
        return 2

    import uvicorn

    from ..api.connections import ConnectionLimits, Doorman
    from ..api.transport import guarded_protocols
    from ..db import DatabaseError
    from ..storage.results import ResultStoreError

    try:
        app = create_app(settings, catalog)
        new_key = prepare_admin_key(settings)
    except (ResultStoreError, DatabaseError) as error:
        print(f"nnhost serve: {error}", file=sys.stderr)
        return 2
    url = settings.public_url or f"http://{settings.host}:{settings.port}"
    if settings.auth == "none":
        key_line = "    # no NDIF_API_KEY needed: --auth none, every request acts as the local admin\n"
    elif new_key:
        key_line = f"    export NDIF_API_KEY={new_key}   # shown once; stored hashed\n"
    elif settings.api_key:
        key_line = f"    export NDIF_API_KEY={settings.api_key}\n"
    else:
        key_line = (
            "    export NDIF_API_KEY=<your key>   # a new one: "
            f"nnhost keys create --data-dir {settings.data_dir}\n"
        )
    # With only [[allow]] entries, the example names their first pattern.
    example = next((spec.repo_id for spec in catalog), None) or catalog.allowed[0].repo_id
    if settings.role == "controller":
        print(
            f"\nnnhost controller starting on {url} (/status, /metrics); it acts once it holds "
            "the controller lease and stands by while another controller does. Clients "
            f"talk to the --role api processes. Serving: {', '.join(s.name for s in catalog)}.\n",
            flush=True,
        )
    else:
        _print_welcome(url, key_line, example, catalog, settings)
    # uvicorn stops gracefully on SIGTERM, then raises it again with the handler
    # it found before it started: this one, so that a stop asked for exits 0.
    signal.signal(signal.SIGTERM, _stopped)
    ceiling, reserve = descriptor_budget(settings.max_connections, settings.descriptor_reserve)
    doorman = Doorman(ConnectionLimits(
        ceiling=ceiling,
        per_address=settings.max_connections_per_address,
        head_timeout=settings.request_head_timeout,
        body_timeout=settings.request_body_timeout,
        exempt=tuple(settings.forwarded_allow_ips),
    ))
    http, websocket = guarded_protocols(doorman)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        # httptools and uvicorn's websockets, each connection admitted by the
        # doorman and held to the head's and body's deadlines (`api.transport`).
        http=http,
        ws=websocket,
        # asyncio accepts up to `backlog` connections at once, before any of
        # them is read. A burst no larger than half the reserve never takes the
        # descriptors the reserve keeps; no larger than half of either cap, it
        # cannot push out a connection admitted just before it whose request
        # is already on its way (it is read in the next pass of the loop).
        backlog=max(16, min(2048, reserve // 2, settings.max_connections_per_address // 2, ceiling // 2)),
        log_level=args.log_level,
        log_config=None,  # uvicorn writes through the handler `configure` set up
        # The client only listens on its websocket: what it may send is small,
        # and never compressed (a deflated message could inflate without bound).
        ws_max_size=64 * 1024,
        ws_per_message_deflate=False,
        timeout_graceful_shutdown=10,
        # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise;
        # here only the proxies the operator names are believed (none by default).
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=",".join(settings.forwarded_allow_ips) or "",
    )
    return 0


def _stopped(signum: int, frame: object) -> None:
    raise SystemExit(0)


def descriptor_budget(connections: int, reserve: int) -> tuple[int, int]:
    """How many connections this process may hold, and the descriptors it keeps from them.

    The soft limit is raised (up to the hard one) so that ``connections``
    sockets fit beside ``reserve`` descriptors for the database, results,
    replicas' pipes and logs. Where the hard limit is lower, fewer
    connections are held (never less than half the limit: a reserve larger
    than the limit itself is cut to half of it), and the log says so.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + reserve
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        soft = max(soft, raised)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return connections, reserve
    kept = min(reserve, soft // 2)
    room = soft - kept
    log.warning(
        "the descriptor limit (%d) leaves room for %d connections beside %d kept in reserve, "
        "not max_connections=%d beside descriptor_reserve=%d; raise the limit (ulimit -n) to hold more",
        soft, room, kept, connections, reserve,
    )
    return room, kept


def _unreachable(url: str) -> Optional[str]:
    """Why the events Redis cannot be used, checked before anything starts; None if it can."""
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5).ping()
    except (redis.RedisError, OSError, ValueError) as error:
        return f"cannot reach Redis ({error}). Start it, or leave events unset for one process."
    return None


def demo_model(args: argparse.Namespace) -> int:
    from ..config import load_settings
    from ..models.demo import DEMO_REPO_ID, build_demo_model
    from .flags import given

    settings = load_settings(given(args))
    snapshot = build_demo_model(settings.hf_home, progress=lambda line: print(line, flush=True))
    print(f"{DEMO_REPO_ID} is ready at {snapshot}")
    return 0

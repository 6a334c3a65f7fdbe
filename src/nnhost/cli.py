"""The ``nnhost`` command: serve models, build the demo model.

``nnhost serve MODEL_ID ...`` runs the API process and one worker process per
model; ``nnhost serve --demo`` builds (once) and serves the offline demo model.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Optional, Sequence


def _serve(args: argparse.Namespace) -> int:
    from .config import load_settings

    settings = load_settings(
        {
            "host": args.host,
            "port": args.port,
            "data_dir": args.data_dir,
            "database": args.database,
            "api_key": args.api_key,
            "time_limit": args.time_limit,
            "kill_grace": args.kill_grace,
            "public_url": args.public_url,
            "torch_threads": args.torch_threads,
            "demo": args.demo or None,
            "models": args.models or None,
            "auth": args.auth,
            "allow_insecure": args.allow_insecure or None,
            "signup": args.signup,
            "memory_budget": ",".join(args.memory_budget) or None,
            "forwarded_allow_ips": args.forwarded_allow_ips,
            "log_format": args.log_format,
            "events": args.events,
            "role": args.role,
            "cluster": args.cluster,
            "results": args.results,
            "results_endpoint": args.results_endpoint,
        },
        Path(args.config) if args.config else None,
    )
    from .auth.access import settings_problem

    problem = settings_problem(settings)
    if problem:
        print(f"nnhost serve: {problem}", file=sys.stderr)
        return 2
    if settings.role != "all" and not settings.events:
        print(
            f"nnhost serve: --role {settings.role} needs --events redis://HOST:PORT (the same "
            "for every process): a job's updates travel from the controller to the API "
            "process that holds its websocket.",
            file=sys.stderr,
        )
        return 2
    if settings.events:
        problem = _unreachable(settings.events)
        if problem:
            print(f"nnhost serve: events = {settings.events!r}: {problem}", file=sys.stderr)
            return 2
    from .telemetry.logs import configure

    configure(settings.log_format, args.log_level)
    # Workers, the Hub mirror and the demo builder must agree on one model cache.
    os.environ.setdefault("HF_HOME", str(settings.hf_home))

    from .app import build_catalog, create_app, parse_model, prepare_admin_key

    specs = [parse_model(text) for text in settings.models]
    if settings.demo:
        from .models.demo import DEMO_REPO_ID, build_demo_model

        print(f"Preparing the demo model {DEMO_REPO_ID} ...", flush=True)
        build_demo_model(settings.hf_home, progress=lambda line: print(f"  {line}", flush=True))
        if not any(spec.repo_id == DEMO_REPO_ID for spec in specs):
            specs.append(parse_model(DEMO_REPO_ID))
    try:
        catalog = build_catalog(settings, specs)
    except ValueError as error:
        print(f"nnhost serve: {error}", file=sys.stderr)
        return 2
    if not list(catalog):
        print(
            "nnhost serve: name at least one model to serve (e.g. `nnhost serve "
            "openai-community/gpt2`, or [[model]] tables in nnhost.toml), or use --demo "
            "for the offline demo model.",
            file=sys.stderr,
        )
        return 2

    import uvicorn

    from .db import DatabaseError
    from .storage.results import ResultStoreError

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
    example = next(iter(catalog)).repo_id
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
        f"Serving: {', '.join(spec.name for spec in catalog)}. Data: {settings.data_dir}\n",
        flush=True,
    )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        log_config=None,  # uvicorn writes through the handler `configure` set up
        ws_max_size=1 << 30,
        timeout_graceful_shutdown=10,
        # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise;
        # here only the proxies the operator names are believed (none by default).
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=",".join(settings.forwarded_allow_ips) or "",
    )
    return 0


def _unreachable(url: str) -> Optional[str]:
    """Why the events Redis cannot be used, checked before anything starts; None if it can."""
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5).ping()
    except (redis.RedisError, OSError, ValueError) as error:
        return f"cannot reach Redis ({error}). Start it, or leave events unset for one process."
    return None


def _demo_model(args: argparse.Namespace) -> int:
    from .config import load_settings
    from .models.demo import DEMO_REPO_ID, build_demo_model

    settings = load_settings({"data_dir": args.data_dir})
    snapshot = build_demo_model(settings.hf_home, progress=lambda line: print(line, flush=True))
    print(f"{DEMO_REPO_ID} is ready at {snapshot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nnhost", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="Run the server.")
    serve.add_argument("models", nargs="*", metavar="MODEL_ID", help="org/name[@revision] to serve")
    serve.add_argument("--demo", action="store_true", help="build and serve the offline demo model")
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8001)")
    serve.add_argument("--data-dir", default=None, help="database, results and model cache")
    serve.add_argument(
        "--database", default=None, metavar="URL",
        help="sqlite:///PATH or postgresql://USER:PASSWORD@HOST/NAME (default DATA_DIR/nnhost.sqlite3)",
    )
    serve.add_argument("--config", default=None, help="a TOML file (default DATA_DIR/nnhost.toml)")
    serve.add_argument("--api-key", default=None, help="accept this key for the admin user")
    serve.add_argument(
        "--time-limit", default=None, help="how long one request may run: seconds, or e.g. 30m"
    )
    serve.add_argument(
        "--kill-grace", default=None, help="seconds past the limit before a kill"
    )
    serve.add_argument("--public-url", default=None, help="base URL clients reach us at")
    serve.add_argument("--torch-threads", type=int, default=None, help="threads per worker")
    serve.add_argument(
        "--auth", default=None, choices=["keys", "none"],
        help="'none': no API keys, every request is the local admin (loopback only)",
    )
    serve.add_argument(
        "--allow-insecure", action="store_true", help="allow --auth none on a non-loopback address"
    )
    serve.add_argument(
        "--signup", default=None, choices=["open", "invite", "closed"],
        help="who may make an account on the web pages (default open)",
    )
    serve.add_argument(
        "--memory-budget",
        action="append",
        default=[],
        metavar="DEVICE=SIZE",
        help="memory HOT models may use on a device, e.g. cpu=8GiB (repeatable)",
    )
    serve.add_argument(
        "--forwarded-allow-ips",
        default=None,
        metavar="ADDRESSES",
        help="proxies whose X-Forwarded-For is believed, comma-separated (default none)",
    )
    serve.add_argument(
        "--results", default=None, metavar="DIR|s3://BUCKET[/PREFIX]",
        help="where results are kept (default DATA_DIR/results)",
    )
    serve.add_argument(
        "--results-endpoint", default=None, metavar="URL",
        help="an S3-compatible endpoint for s3:// results (default AWS)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--cluster", default=None, metavar="ADDRESS",
                       help="run replicas on a Ray cluster: auto, or its address (HOST:PORT)")
    serve.add_argument("--events", default=None, metavar="URL",
                       help="carry job updates over Redis (redis://HOST:PORT) for several API processes")
    serve.add_argument(
        "--role", default=None, choices=["all", "api", "controller"],
        help="all (default): one process; api: requests and websockets only; controller: "
             "the queue and the replicas (one acts, others stand by); api and controller "
             "processes share --database, --events and --results",
    )
    serve.add_argument("--log-format", default=None, choices=["text", "json"],
                       help="server log lines: text (default) or one JSON object per line")
    serve.set_defaults(run=_serve)

    demo = commands.add_parser("demo-model", help="Build the offline demo model into the cache.")
    demo.add_argument("--data-dir", default=None)
    demo.set_defaults(run=_demo_model)

    from .operator_cli import register as register_operator_commands

    register_operator_commands(commands)

    from .auth.cli import register as register_account_commands

    register_account_commands(commands)  # users, keys, invites
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    from .config import SettingsError

    try:
        return args.run(args)
    except SettingsError as error:
        # The operator's mistake, not ours: the message, no traceback.
        for line in str(error).splitlines():
            print(f"nnhost {args.command}: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``nnhost`` command: serve models, build the demo model, run the server.

``nnhost serve MODEL_ID ...`` runs the server (`serve`); ``nnhost serve --demo``
builds (once) and serves the offline demo model. The operator's commands are
in the same room: ``status``, ``deploy``, ``evict``, ``jobs``, ``cancel`` talk
to a running server over HTTP (`operate`); ``users``, ``keys`` and
``invites`` work on its database (`people`). This module only builds the
parser and dispatches.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional, Sequence

from .serve import demo_model, serve_command


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
    serve.set_defaults(run=serve_command)

    demo = commands.add_parser("demo-model", help="Build the offline demo model into the cache.")
    demo.add_argument("--data-dir", default=None)
    demo.set_defaults(run=demo_model)

    from .operate import register as register_operator_commands

    register_operator_commands(commands)

    from .people import register as register_account_commands

    register_account_commands(commands)  # users, keys, invites
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    from ..config import SettingsError

    try:
        return args.run(args)
    except SettingsError as error:
        # The operator's mistake, not ours: the message, no traceback.
        for line in str(error).splitlines():
            print(f"nnhost {args.command}: {line}", file=sys.stderr)
        return 2


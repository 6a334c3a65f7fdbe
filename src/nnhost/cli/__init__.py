"""The ``nnhost`` command: serve models, build the demo model, run the server.

``nnhost serve MODEL_ID ...`` runs the server (`serve`); ``nnhost serve --demo``
builds (once) and serves the offline demo model. The operator's commands are
in the same room: ``status``, ``deploy``, ``evict``, ``jobs``, ``cancel`` talk
to a running server over HTTP (`operate`); ``users``, ``keys`` and
``invites`` work on its database (`people`). ``settings`` prints every setting
as the Markdown tables of docs/configuration.md (`settings_docs`). This module
only builds the parser and dispatches.

May import: `app` (the composition root), `api`, `auth`, `db`, `models`, `storage`,
`telemetry`, and the top-level modules (`config`, `runtimes`, `units`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Optional, Sequence

from .flags import add_setting_flags
from .serve import demo_model, serve_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nnhost", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve", help="Run the server.",
        description="Run the server. Each flag below but --config and --log-level is a setting "
        "(docs/configuration.md): a flag given wins over NNHOST_* variables, which win over "
        "nnhost.toml.",
    )
    serve.add_argument(
        "models", nargs="*", metavar="MODEL_ID",
        help="org/name[@revision] to serve (the setting models)",
    )
    serve.add_argument("--config", default=None, help="a TOML file (default DATA_DIR/nnhost.toml)")
    serve.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="how much the server logs (default info)",
    )
    add_setting_flags(serve)  # one flag per setting marked Flag() in nnhost.config.Settings
    serve.set_defaults(run=serve_command)

    demo = commands.add_parser("demo-model", help="Build the offline demo model into the cache.")
    add_setting_flags(demo, only=["data_dir"])
    demo.set_defaults(run=demo_model)

    runtimes = commands.add_parser(
        "runtimes", add_help=False,
        help="Build the environments that serve other nnsight versions' clients (`nnhost runtimes -h`).")
    runtimes.add_argument("rest", nargs=argparse.REMAINDER)  # parsed by nnhost.runtimes (see main)

    from .operate import register as register_operator_commands

    register_operator_commands(commands)

    from .people import register as register_account_commands

    register_account_commands(commands)  # users, keys, invites

    from .settings_docs import register as register_settings_command

    register_settings_command(commands)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["runtimes"]:
        from .. import runtimes

        return runtimes.main(argv[1:])  # its own parser: its -h is its own
    args = build_parser().parse_args(argv)
    from ..config import SettingsError

    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except SettingsError as error:
        # The operator's mistake, not ours: the message, no traceback.
        for line in str(error).splitlines():
            print(f"nnhost {args.command}: {line}", file=sys.stderr)
        return 2


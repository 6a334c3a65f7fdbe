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
            "api_key": args.api_key,
            "time_limit": args.time_limit,
            "kill_grace": args.kill_grace,
            "public_url": args.public_url,
            "torch_threads": args.torch_threads,
            "demo": args.demo or None,
            "models": args.models or None,
        },
        Path(args.config) if args.config else None,
    )
    # Workers, the Hub mirror and the demo builder must agree on one model cache.
    os.environ.setdefault("HF_HOME", str(settings.hf_home))

    from .app import create_app, parse_model, prepare_admin_key
    from .deployments.catalog import Catalog

    specs = [parse_model(text) for text in settings.models]
    if settings.demo:
        from .models.demo import DEMO_REPO_ID, build_demo_model

        print(f"Preparing the demo model {DEMO_REPO_ID} ...", flush=True)
        build_demo_model(settings.hf_home, progress=lambda line: print(f"  {line}", flush=True))
        if not any(spec.repo_id == DEMO_REPO_ID for spec in specs):
            specs.append(parse_model(DEMO_REPO_ID))
    if not specs:
        print(
            "nnhost serve: name at least one model to serve (e.g. `nnhost serve "
            "openai-community/gpt2`), or use --demo for the offline demo model.",
            file=sys.stderr,
        )
        return 2

    import uvicorn

    app = create_app(settings, Catalog(specs))
    new_key = prepare_admin_key(settings)
    url = settings.public_url or f"http://{settings.host}:{settings.port}"
    if new_key:
        key_line = f"    export NDIF_API_KEY={new_key}   # shown once; stored hashed\n"
    elif settings.api_key:
        key_line = f"    export NDIF_API_KEY={settings.api_key}\n"
    else:
        key_line = (
            "    export NDIF_API_KEY=<your key>   # a new one: "
            f"nnhost keys create --data-dir {settings.data_dir}\n"
        )
    example = settings.models[0] if settings.models else "nnhost/demo-gpt2"
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
        f"Serving: {', '.join(spec.name for spec in specs)}. Data: {settings.data_dir}\n",
        flush=True,
    )
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        ws_max_size=1 << 30,
        timeout_graceful_shutdown=10,
    )
    return 0


def _demo_model(args: argparse.Namespace) -> int:
    from .config import load_settings
    from .models.demo import DEMO_REPO_ID, build_demo_model

    settings = load_settings({"data_dir": args.data_dir})
    snapshot = build_demo_model(settings.hf_home, progress=lambda line: print(line, flush=True))
    print(f"{DEMO_REPO_ID} is ready at {snapshot}")
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    from .app import ADMIN_EMAIL
    from .auth.keys import KeyStore
    from .config import load_settings
    from .jobs.store import connect

    settings = load_settings({"data_dir": args.data_dir})
    connection = connect(settings.database_path)
    try:
        keys = KeyStore(connection)
        email = args.email or ADMIN_EMAIL
        user = keys.user_by_email(email)
        user_id = user.user_id if user else keys.add_user(email, ("admin",) if email == ADMIN_EMAIL else ())
        print(keys.create_key(user_id, name=args.name or "cli"))
    finally:
        connection.close()
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
    serve.add_argument("--config", default=None, help="a TOML file (default DATA_DIR/nnhost.toml)")
    serve.add_argument("--api-key", default=None, help="accept this key for the admin user")
    serve.add_argument("--time-limit", type=float, default=None, help="seconds per request")
    serve.add_argument(
        "--kill-grace", type=float, default=None, help="seconds past the limit before a kill"
    )
    serve.add_argument("--public-url", default=None, help="base URL clients reach us at")
    serve.add_argument("--torch-threads", type=int, default=None, help="threads per worker")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(run=_serve)

    demo = commands.add_parser("demo-model", help="Build the offline demo model into the cache.")
    demo.add_argument("--data-dir", default=None)
    demo.set_defaults(run=_demo_model)

    keys = commands.add_parser("keys", help="Manage API keys.")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = key_commands.add_parser("create", help="Make a new key and print it (once).")
    create.add_argument("--email", default=None, help="the key's owner (default the admin)")
    create.add_argument("--name", default=None, help="a label to tell keys apart")
    create.add_argument("--data-dir", default=None)
    create.set_defaults(run=_keys_create)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

"""One `Settings` object for the whole server.

Precedence, lowest first: the defaults here, ``nnhost.toml`` in the data
directory (or ``--config``), ``NNHOST_*`` environment variables, then
command-line flags. Every part of the server reads its knobs from here, so
there is one place to see what can be tuned.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Optional

MiB = 1024 * 1024


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8001
    data_dir: Path = Path("./nnhost-data")
    #: Repo ids served (each may be "org/name" or "org/name@revision").
    models: list[str] = field(default_factory=list)
    #: Build and serve the offline demo model.
    demo: bool = False
    #: A key to accept for the admin user (else one is generated on first start).
    api_key: Optional[str] = None
    #: Public base URL for result links when behind a proxy (else taken from the request).
    public_url: Optional[str] = None
    #: Seconds one request may run.
    time_limit: float = 3600.0
    #: Seconds past the time limit before a worker that ignores the interrupt is killed.
    kill_grace: float = 10.0
    #: Results up to this size ride inline on the websocket; larger ones go by link.
    inline_result_bytes: int = 1 * MiB
    #: Largest result kept (0: no limit).
    max_result_bytes: int = 4096 * MiB
    #: Largest request body accepted.
    max_request_bytes: int = 256 * MiB
    #: Seconds a result stays downloadable.
    result_retention: float = 24 * 3600.0
    #: Threads torch may use in each worker (0: torch's default).
    torch_threads: int = 0
    #: Largest number of LOG lines forwarded from one job.
    max_log_lines: int = 10_000
    #: Oldest nnsight client accepted.
    min_nnsight_version: str = "0.8.0"
    #: Serve weight files from the Hub mirror as well as configs and tokenizers.
    hub_serve_weights: bool = False
    #: Models from nnhost.toml's ``[[model]]`` tables (load options per model).
    catalog: list[dict] = field(default_factory=list)
    #: Memory HOT deployments may use per device, e.g. {"cpu": "16GiB", "cuda:0": "80GB"}.
    #: A device not listed is unbounded; "cpu" defaults to 80% of this machine's memory.
    memory_budget: dict = field(default_factory=dict)
    #: Extra memory reserved per replica on top of its weights (activations, slack).
    memory_margin: float = 0.25
    #: Allow catalog models that need trust_remote_code.
    allow_trust_remote_code: bool = False
    #: Seconds a graceful shutdown (SIGTERM) waits for running jobs before requeueing them.
    shutdown_grace: float = 30.0
    #: "keys": every API call needs a key. "none": everyone is the local admin (loopback only).
    auth: str = "keys"
    #: Allow ``auth = "none"`` on a non-loopback address.
    allow_insecure: bool = False
    #: Who may make an account on the web pages: "open", "invite" (a code from the CLI) or "closed".
    signup: str = "open"
    #: Seconds a web login lasts.
    session_ttl: float = 14 * 24 * 3600.0
    #: Per-tag limits, from nnhost.toml's ``[limits.TAG]`` tables (see nnhost.auth.limits);
    #: as an environment variable, a JSON object.
    limits: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Failed API key (or password) attempts one client address may make per window.
    auth_failure_limit: int = 30
    #: Seconds of that window.
    auth_failure_window: float = 300.0
    #: Contain user code (restricted unpickling, import allowlist, read-only weights,
    #: OS-level layers; see README "Security"). false only for trusted deployments.
    containment: bool = True
    #: Top-level modules user code may import (nnsight is always allowed).
    allowed_imports: list[str] = field(
        default_factory=lambda: [
            "builtins", "math", "typing", "collections", "time",
            "torch", "numpy", "einops", "sympy", "nnterp",
        ]
    )
    #: Memory one job may use on top of the loaded worker (0: 8 GiB).
    job_memory_bytes: int = 0
    #: Size of the private scratch space (/tmp) of a contained worker.
    scratch_bytes: int = 256 * MiB
    #: Contained workers run as uid/gid worker_uid_base + their pid.
    worker_uid_base: int = 200_000
    #: More paths a contained worker must not see (the data dir and model cache always are).
    hidden_paths: list[str] = field(default_factory=list)
    #: TESTS ONLY, never in production: a job's process runs raw, unrestricted Python
    #: prefixed to a payload (the isolation tests play a user who beat the sandbox).
    unsafe_test_hooks: bool = False

    @property
    def database_path(self) -> Path:
        return self.data_dir / "nnhost.sqlite3"

    @property
    def hf_home(self) -> Path:
        """Where models are cached: HF_HOME if set, else a folder of the data dir."""
        explicit = os.environ.get("HF_HOME")
        return Path(explicit) if explicit else self.data_dir / "huggingface"


def _coerce(kind: Any, value: Any) -> Any:
    text = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    if isinstance(value, str):
        if "bool" in text:
            return value.strip().lower() in ("1", "true", "yes", "on")
        if "int" in text:
            return int(value)
        if "float" in text:
            return float(value)
        if "list" in text:
            return [part for part in value.split(",") if part]
        if "dict" in text:
            pairs = (part.split("=", 1) for part in value.split(",") if "=" in part)
            return {key.strip(): item.strip() for key, item in pairs}
        if "Path" in text:
            return Path(value)
    if "Path" in text and value is not None:
        return Path(value)
    return value


def load_settings(overrides: dict[str, Any], config_file: Optional[Path] = None) -> Settings:
    """Build the settings from defaults < toml < environment < ``overrides`` (flags)."""
    values: dict[str, Any] = {}
    known = {f.name: f.type for f in fields(Settings)}
    data_dir = overrides.get("data_dir") or os.environ.get("NNHOST_DATA_DIR") or Settings.data_dir
    config_file = config_file or Path(data_dir) / "nnhost.toml"
    if config_file.is_file():
        with open(config_file, "rb") as file:
            table = tomllib.load(file)
        for name, value in table.get("server", table).items():
            if name in known:
                values[name] = _coerce(known[name], value)
        if "model" in table:
            values["catalog"] = list(table["model"])
        if "limits" in table:
            values["limits"] = dict(table["limits"])
    for name, kind in known.items():
        env = os.environ.get(f"NNHOST_{name.upper()}")
        if env is not None:
            values[name] = _coerce(kind, env)
    for name, value in overrides.items():
        if value is not None and name in known:
            values[name] = _coerce(known[name], value)
    settings = Settings(**values)
    settings.data_dir = Path(settings.data_dir).expanduser().resolve()
    return settings

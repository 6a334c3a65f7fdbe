"""One `Settings` object for the whole server, validated before anything starts.

Precedence, lowest first: the defaults here, ``nnhost.toml`` in the data
directory (or ``--config``), ``NNHOST_*`` environment variables, then
command-line flags. Every part of the server reads its knobs from here, so
there is one place to see what can be tuned.

A setting that is silently wrong is worse than none: an unknown key (in the
TOML file or as an ``NNHOST_`` variable), a boolean that is not one, a size or
a duration that does not parse stops the server with `SettingsError`, whose
message names the key, the value, where it came from and what is accepted.
This module must never guess what a bad value meant.

To add a setting, add one annotated field to `Settings` (with a ``#:`` comment
and a line in README's table); sizes use `Size`, durations `Duration`.
"""

from __future__ import annotations

import contextvars
import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional

from packaging.version import InvalidVersion, Version
from pydantic import BeforeValidator, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .config_errors import ENV_PREFIX, Origins, describe, unknown_environment
from .execution.sandbox_rules import DEFAULT_ALLOWED_IMPORTS
from .units import parse_duration, parse_size

MiB = 1024 * 1024


def _split(value: Any) -> Any:
    """A list from the environment: JSON (``["a", "b"]``) or comma-separated."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def _pairs(value: Any) -> Any:
    """A table from the environment: JSON (``{"cpu": "8GiB"}``) or ``key=value,key=value``."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            return json.loads(text)
        table = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, equals, item = part.partition("=")
            if not equals:
                raise ValueError(f"{part!r} is not key=value (e.g. cpu=16GiB)")
            table[key.strip()] = item.strip()
        return table
    return value


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) and value.strip() else value


#: Bytes: a number or a size with SI or IEC units (see nnhost.units).
Size = Annotated[int, BeforeValidator(parse_size)]
#: Seconds: a number, or a duration like "24h".
Duration = Annotated[float, BeforeValidator(parse_duration)]
Names = Annotated[list[str], BeforeValidator(_split)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        enable_decoding=False,  # lists and tables from the environment are parsed below
        validate_default=True,
    )

    host: str = "127.0.0.1"
    port: int = Field(8001, ge=1, le=65535)
    data_dir: Path = Path("./nnhost-data")
    #: Where jobs, users and keys are kept: sqlite:///PATH or postgresql://USER:PASSWORD@HOST/NAME
    #: (default: the SQLite file DATA_DIR/nnhost.sqlite3).
    database: Optional[str] = None
    #: Repo ids served (each may be "org/name" or "org/name@revision").
    models: Names = Field(default_factory=list)
    #: Build and serve the offline demo model.
    demo: bool = False
    #: A key to accept for the admin user (else one is generated on first start).
    api_key: Optional[str] = None
    #: Public base URL for result links when behind a proxy (else taken from the request).
    public_url: Optional[str] = None
    #: Seconds one request may run.
    time_limit: Annotated[Duration, Field(gt=0)] = 3600.0
    #: Seconds past the time limit before a worker that ignores the interrupt is killed.
    kill_grace: Duration = 10.0
    #: Results up to this size ride inline on the websocket; larger ones go by link.
    inline_result_bytes: Size = 1 * MiB
    #: Largest result kept (0: no limit).
    max_result_bytes: Size = 4096 * MiB
    #: Largest request body accepted.
    max_request_bytes: Size = 256 * MiB
    #: Seconds a result (and the job's LOG lines) stays downloadable.
    result_retention: Duration = 24 * 3600.0
    #: Where results are kept: a directory (default DATA_DIR/results; one all machines
    #: share, in a cluster) or s3://BUCKET[/PREFIX] (credentials from the AWS environment).
    results: Optional[str] = None
    #: URL of an S3-compatible endpoint for s3:// results (default: AWS's own).
    results_endpoint: Optional[str] = None
    #: Threads torch may use in each job (0: the cores less one, split between the replicas).
    torch_threads: int = Field(0, ge=0)
    #: Largest number of LOG lines kept and forwarded from one job.
    max_log_lines: int = Field(10_000, ge=0)
    #: Largest total size of the LOG lines kept and forwarded from one job.
    max_log_bytes: Size = 1 * MiB
    #: Oldest nnsight client accepted.
    min_nnsight_version: str = "0.8.0"
    #: Serve weight files from the Hub mirror as well as configs and tokenizers.
    hub_serve_weights: bool = False
    #: Models from nnhost.toml's ``[[model]]`` tables (load options per model).
    catalog: Annotated[list[dict], BeforeValidator(_json)] = Field(default_factory=list)
    #: Models fetched from the Hub (HF_ENDPOINT, HF_TOKEN) on first request, from
    #: nnhost.toml's ``[[allow]]`` tables (repo-id pattern, max_size, dtype, device).
    allow: Annotated[list[dict], BeforeValidator(_json)] = Field(default_factory=list)
    #: Disk the models fetched on demand may take together; the least recently used
    #: is deleted to make room (0: no limit). Listed models never count or go.
    download_budget: Size = 0
    #: Memory HOT deployments may use per device, e.g. {"cpu": "16GiB", "cuda:0": "80GB"},
    #: held as bytes. A device not listed is unbounded; "cpu" defaults to 80% of this
    #: machine's memory.
    memory_budget: Annotated[dict[str, Size], BeforeValidator(_pairs)] = Field(default_factory=dict)
    #: Extra memory reserved per replica on top of its weights (activations, slack).
    memory_margin: float = Field(0.25, ge=0)
    #: Allow catalog models that need trust_remote_code.
    allow_trust_remote_code: bool = False
    #: Seconds an extra replica (beyond a model's ``replicas``) stays idle before it is stopped.
    scale_down_after: Duration = 300.0
    #: Seconds a model's oldest queued job waits before another replica is started
    #: (up to its ``max_replicas``, where there is room).
    scale_up_after: Duration = 5.0
    #: Seconds a graceful shutdown (SIGTERM) waits for running jobs before requeueing them.
    shutdown_grace: Duration = 30.0
    #: "keys": every API call needs a key. "none": everyone is the local admin (loopback only).
    auth: Literal["keys", "none"] = "keys"
    #: Allow ``auth = "none"`` on a non-loopback address.
    allow_insecure: bool = False
    #: Who may make an account on the web pages: "open", "invite" (a code from the CLI) or "closed".
    signup: Literal["open", "invite", "closed"] = "open"
    #: Where replicas run: none (processes on this machine), "auto" or a Ray address (HOST:PORT).
    cluster: Optional[str] = None
    #: Where job updates travel between processes: none (in this process) or a Redis URL.
    events: Optional[str] = None
    #: What this process does: "all" (everything, one process), "api" (requests,
    #: websockets and results; never runs models) or "controller" (the queue, the
    #: deployments and the replicas; one acts at a time, others stand by).
    role: Literal["all", "api", "controller"] = "all"
    #: Server log lines: "text", or "json" (one object per line, with job and request ids).
    log_format: Literal["text", "json"] = "text"
    #: Seconds a web login lasts.
    session_ttl: Duration = 14 * 24 * 3600.0
    #: Per-tag limits, from nnhost.toml's ``[limits.TAG]`` tables (see nnhost.auth.limits);
    #: as an environment variable, a JSON object.
    limits: Annotated[dict[str, Any], BeforeValidator(_json)] = Field(default_factory=dict)
    #: Failed API key (or password) attempts one client address may make per window
    #: before its further failures are refused (a valid key still works).
    auth_failure_limit: int = Field(30, ge=0)
    #: Seconds of that window.
    auth_failure_window: Duration = 300.0
    #: Accounts one client address may make an hour through the sign-up page (0: no limit).
    signups_per_address: int = Field(10, ge=0)
    #: Who may read /metrics: "key" (a key tagged admin or metrics) or "public".
    metrics_access: Literal["key", "public"] = "key"
    #: Connections (websockets included) one server process holds at once; past it a request gets 503.
    max_connections: int = Field(1000, ge=1)
    #: Proxies whose X-Forwarded-For / X-Forwarded-Proto headers are believed
    #: (addresses or networks, or "*"); none by default.
    forwarded_allow_ips: Names = Field(default_factory=list)
    #: Contain user code (restricted unpickling, import allowlist, read-only weights,
    #: OS-level layers; see README "Security"). false only for trusted deployments.
    containment: bool = True
    #: How contained jobs run: "fork" (each job's process forked from the process
    #: holding the weights), "mapped" (forked from a template without weights,
    #: mapping them by handle; see docs), or "auto" (fork on the CPU).
    execution: Literal["auto", "fork", "mapped"] = "auto"
    #: Host processes kept started and prepared (libraries imported) so that a cold
    #: start only loads the weights; each holds a few hundred MB of memory (0: none).
    spare_hosts: int = Field(1, ge=0, le=8)
    #: Top-level modules user code may import (nnsight is always allowed).
    allowed_imports: Names = Field(default_factory=lambda: list(DEFAULT_ALLOWED_IMPORTS))
    #: Memory one job may use on top of the loaded worker (0: 8 GiB).
    job_memory_bytes: Size = 0
    #: Size of the private scratch space (/tmp) of a contained worker.
    scratch_bytes: Size = 256 * MiB
    #: Contained workers run as uid/gid worker_uid_base + their pid.
    worker_uid_base: int = Field(200_000, ge=1)
    #: More paths a contained worker must not see (the data dir and model cache always are).
    hidden_paths: Names = Field(default_factory=list)
    #: TESTS ONLY, never in production: a job's process runs raw, unrestricted Python
    #: prefixed to a payload (the isolation tests play a user who beat the sandbox).
    unsafe_test_hooks: bool = False

    @field_validator("min_nnsight_version")
    @classmethod
    def _version(cls, value: str) -> str:
        try:
            Version(value)
        except InvalidVersion:
            raise ValueError("not a version; use one like 0.8.0 or 0.9.0rc1") from None
        return value

    @field_validator("catalog")
    @classmethod
    def _models(cls, tables: list[dict]) -> list[dict]:
        from .deployments.catalog import ModelSpec

        for table in tables:
            if not isinstance(table, dict):
                raise ValueError("each [[model]] must be a table with a repo_id")
            ModelSpec.from_table(dict(table))  # raises, naming the table and the key
        return tables

    @field_validator("allow")
    @classmethod
    def _allowed(cls, tables: list[dict]) -> list[dict]:
        from .deployments.catalog import AllowRule

        for table in tables:
            if not isinstance(table, dict):
                raise ValueError("each [[allow]] must be a table with a repo_id and a max_size")
            AllowRule.from_table(dict(table))  # raises, naming the table and the key
        return tables

    @field_validator("limits")
    @classmethod
    def _limits(cls, tables: dict) -> dict:
        from .auth.limits import LimitPolicy

        LimitPolicy(tables, max_request_bytes=1)  # raises LimitsConfigError, naming the entry
        return tables

    @field_validator("events")
    @classmethod
    def _events(cls, value: Optional[str]) -> Optional[str]:
        if value in (None, ""):
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("use a Redis URL: redis://HOST:PORT[/DB], rediss://... or unix://PATH")
        return value

    @field_validator("database")
    @classmethod
    def _database(cls, value: Optional[str]) -> Optional[str]:
        from .db.urls import check_url

        return check_url(value) if value is not None else None

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return Path(value).expanduser().resolve()

    @field_validator("results")
    @classmethod
    def _results(cls, value: Optional[str]) -> Optional[str]:
        from .storage.s3 import is_s3_url, parse_s3_url

        if value is None:
            return None
        if is_s3_url(value):
            return str(parse_s3_url(value)).rstrip("/")  # raises, saying what S3 accepts
        if "://" in value:
            raise ValueError("use a directory path or s3://BUCKET[/PREFIX]")
        return str(Path(value).expanduser().resolve())

    @field_validator("results_endpoint")
    @classmethod
    def _endpoint(cls, value: Optional[str], info) -> Optional[str]:
        from urllib.parse import urlsplit

        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "use the endpoint's URL, e.g. http://127.0.0.1:9000 or https://s3.example.org"
            )
        if "results" not in info.data:
            return value  # results itself is wrong, and says so
        if not (info.data["results"] or "").startswith("s3://"):
            raise ValueError(
                'an endpoint is only used with s3:// results; set results = "s3://BUCKET" too'
            )
        return value.rstrip("/")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest first: flags (the constructor's arguments), environment, TOML.
        return (init_settings, env_settings, _TomlSource(settings_cls))

    @property
    def database_path(self) -> Path:
        """The default database: a SQLite file in the data directory."""
        return self.data_dir / "nnhost.sqlite3"

    @property
    def results_dir(self) -> Optional[Path]:
        """The directory results are kept in, or None when they go to S3."""
        if self.results is None:
            return self.data_dir / "results"
        return None if self.results.startswith("s3://") else Path(self.results)

    @property
    def database_url(self) -> str:
        from .db.urls import sqlite_url

        return self.database or sqlite_url(self.database_path)

    @property
    def hf_home(self) -> Path:
        """Where models are cached: HF_HOME if set, else a folder of the data dir."""
        explicit = os.environ.get("HF_HOME")
        return Path(explicit) if explicit else self.data_dir / "huggingface"


#: The TOML values `load_settings` read, for `_TomlSource` (empty outside it).
_TOML_VALUES: contextvars.ContextVar[dict] = contextvars.ContextVar("nnhost_toml", default={})  # noqa: B039 (read, never mutated)


class _TomlSource(PydanticBaseSettingsSource):
    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ is used
        return _TOML_VALUES.get().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_TOML_VALUES.get())


class SettingsError(ValueError):
    """The settings cannot be served; the message is for the operator, one problem a line."""


def read_toml(path: Path) -> dict[str, Any]:
    """nnhost.toml as flat settings: top-level keys and ``[server]``, plus its tables."""
    try:
        with open(path, "rb") as file:
            table = tomllib.load(file)
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"{path} is not valid TOML: {error}") from None
    except OSError as error:
        raise SettingsError(f"cannot read the settings file {path}: {error.strerror}") from None
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "server":
            if not isinstance(value, dict):
                raise SettingsError(f"{path}: server must be a table ([server])")
            values.update(value)
        elif key == "model":
            if not isinstance(value, list):
                raise SettingsError(
                    f"{path}: write each model as an array table, [[model]] (two brackets)"
                )
            values["catalog"] = value
        elif key == "allow" and not isinstance(value, list):
            raise SettingsError(
                f"{path}: write each allowed pattern as an array table, [[allow]] (two brackets)"
            )
        else:
            values[key] = value
    return values


def load_settings(overrides: Mapping[str, Any], config_file: Optional[Path] = None) -> Settings:
    """Build the settings from defaults < toml < environment < ``overrides`` (flags).

    Raises `SettingsError` naming every bad key and value; None in ``overrides``
    means "flag not given".
    """
    flags = {name: value for name, value in overrides.items() if value is not None}
    environ = {name.upper(): value for name, value in os.environ.items()}
    problems = unknown_environment(environ, Settings.model_fields)
    data_dir = flags.get("data_dir") or environ.get("NNHOST_DATA_DIR") or "./nnhost-data"
    explicit = config_file is not None
    config_file = Path(config_file) if explicit else Path(data_dir).expanduser() / "nnhost.toml"
    toml: dict[str, Any] = {}
    if explicit and not config_file.is_file():
        problems.append(f"--config {config_file}: no such file")
    elif config_file.is_file():
        toml = read_toml(config_file)
    if problems:
        raise SettingsError("\n".join(problems))
    token = _TOML_VALUES.set(toml)
    try:
        return Settings(**flags)
    except ValidationError as error:
        where = Origins(flags, environ, toml, config_file)
        raise SettingsError(
            "\n".join(describe(item, where, Settings.model_fields) for item in error.errors())
        ) from None
    finally:
        _TOML_VALUES.reset(token)

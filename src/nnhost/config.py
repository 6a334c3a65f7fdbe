"""One `Settings` object for the whole server, validated before anything starts.

Precedence, lowest first: the defaults here, ``nnhost.toml`` in the data
directory (or ``--config``), ``NNHOST_*`` environment variables, then
command-line flags. Every part of the server reads its knobs from here, so
there is one place to see what can be tuned.

A setting that is silently wrong is worse than none: an unknown key (in the
TOML file, a ``[[model]]`` table or as an ``NNHOST_`` variable), a boolean that
is not one, a size or a duration that does not parse stops the server with
`SettingsError`, whose message names the key, the value, where it came from and
what is accepted. This module must never guess what a bad value meant.

To add a setting, add one field to `Settings`: its type (sizes use `Size`,
durations `Duration`), default and ``description``, plus `Flag()` in its
``Annotated`` when ``nnhost serve`` should take it on the command line too (the
flag, its help and its parsing are generated from the field: `nnhost.cli.flags`).
Where the default is worked out at start (from this machine or installation),
`Shown` says what the documentation shows instead. Then run ``make docs``: the
tables of docs/configuration.md are rendered from these declarations
(`nnhost.cli.settings_docs`), and a test fails while they differ. Checks that
involve two settings go in `Settings._together`, one place.
"""

from __future__ import annotations

import contextvars
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .client_versions import served_client_versions
from .config_errors import ENV_PREFIX, Origins, SettingConflict, describe, unknown_environment
from .execution.python_layer.sandbox_rules import DEFAULT_ALLOWED_IMPORTS
from .models.catalog import TRANSFORMERS_CLASS, AllowRule, ModelKey, ModelSpec
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


@dataclass(frozen=True)
class Flag:
    """Marks a setting that ``nnhost serve`` also takes as ``--NAME-WITH-DASHES``.

    Put it in the field's ``Annotated``; the flag is generated from the field
    (`nnhost.cli.flags`): its help is the field's description, a boolean is a
    switch (given: true), a choice offers the `Literal`'s values, a table is a
    repeatable ``KEY=VALUE``, a plain whole number is checked as one; any other
    value is handed to the setting as written. ``metavar`` names the value in
    ``--help`` (default: the name in capitals, or the choices).
    """

    metavar: Optional[str] = None


def flag_of(field: FieldInfo) -> Optional[Flag]:
    """The `Flag` a `Settings` field carries, or None when it is no flag."""
    return next((item for item in field.metadata if isinstance(item, Flag)), None)


@dataclass(frozen=True)
class Shown:
    """What ``--help`` and docs/configuration.md show as a setting's default.

    For a default that is a placeholder (None, 0) or is worked out at start
    from this machine or installation, so that its value here would mislead
    or differ from one machine to the next. Markdown: backticks mark a value
    (``--help`` shows the text without them).
    """

    default: str


def shown_of(field: FieldInfo) -> Optional[Shown]:
    """The `Shown` a field carries, or None when its default is shown as it is."""
    return next((item for item in field.metadata if isinstance(item, Shown)), None)


class ModelEntry(BaseModel):
    """One ``[[model]]`` table of nnhost.toml: a model served, and how it is loaded.

    A key that is not a field below is refused, naming the key and the table.
    The defaults are `models.catalog.ModelSpec`'s, which the server builds
    from each entry (`spec`); the entry itself is never changed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo_id: str = Field(min_length=1, description="The model's Hub repo id, org/name.")
    revision: Optional[str] = Field(None, description="A branch, tag or commit (default main).")
    task: str = Field("text-generation", description="The pipeline task it is served for.")
    model_class: str = Field(TRANSFORMERS_CLASS, description="The nnsight class it loads as.")
    trust_remote_code: bool = Field(
        False, description="Run the repository's own code (needs allow_trust_remote_code)."
    )
    dtype: Optional[str] = Field(
        None, description="The dtype weights are held in; with quantization, the compute dtype."
    )
    device: str = Field("cpu", description='Where a HOT replica holds its weights: "cpu", "cuda:1"...')
    # Values are checked by `ModelSpec.check_load_options`, whose message says what to write.
    device_map: Union[str, dict[str, Any], None] = Field(
        None, description='Spread over GPUs: "auto", "balanced", "sequential" or {module = device}.'
    )
    devices: list[Union[str, int]] = Field(
        default_factory=list, description="The GPUs a device_map strategy may use."
    )
    quantization: Optional[str] = Field(
        None,
        description="Hold the weights quantized, in nnsight 0.8.1's names: nf4, int4, fp4, int8 or "
        "fp8 (needs bitsandbytes or a GPU).",
    )
    replicas: int = Field(1, ge=1, description="Replicas a HOT deployment keeps (its minimum).")
    max_replicas: Optional[int] = Field(
        None, ge=1, description="The most replicas it may grow to while jobs wait."
    )
    deploy: Literal["hot", "warm", "cold"] = Field(
        "hot", description="Its level at start; a cold model is deployed on its first request."
    )
    load_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for the model class at load."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelEntry:
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError(
                f"{self.repo_id}: max_replicas must be at least replicas ({self.replicas})"
            )
        self.spec().check_load_options()  # raises, naming the model and what to write
        return self

    def spec(self) -> ModelSpec:
        """A fresh `ModelSpec` for this entry (the server fills in its sizes)."""
        return ModelSpec(**self.model_dump())


class AllowEntry(BaseModel):
    """One ``[[allow]]`` table of nnhost.toml: models fetched from the Hub on first request.

    A key that is not a field below is refused, naming the key and the table.
    The server matches requests against the `models.catalog.AllowRule`
    each entry makes (`rule`); the entry itself is never changed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo_id: str = Field(min_length=1, description='A repo-id pattern (fnmatch): "org/*", "*".')
    max_size: Size = Field(gt=0, description='Largest weights accepted, as held in dtype: "2GB".')
    dtype: Optional[str] = Field(None, description="The dtype weights are held in.")
    device: str = Field("cpu", description="Where a HOT replica holds its weights.")
    task: str = Field("text-generation", description="The task used when a client's key names none.")
    model_class: str = Field(TRANSFORMERS_CLASS, description="The nnsight class it loads as.")
    trust_remote_code: bool = Field(
        False, description="Let a matching key ask for the repository's own code (needs allow_trust_remote_code)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> AllowEntry:
        self.rule().spec(ModelKey(self.model_class, "org/name")).check_load_options()
        return self

    def rule(self) -> AllowRule:
        return AllowRule(**self.model_dump())


class Settings(BaseSettings):
    """Every knob of the server: docs/configuration.md's table (rendered from here) says what each does."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        enable_decoding=False,  # lists and tables from the environment are parsed below
        validate_default=True,
    )

    host: Annotated[str, Flag()] = Field(
        "127.0.0.1", description="Address to bind; 0.0.0.0 accepts connections from other machines."
    )
    port: Annotated[int, Flag()] = Field(8001, ge=1, le=65535, description="Port to bind.")
    data_dir: Annotated[Path, Flag(), Shown("`./nnhost-data`")] = Field(
        Path("./nnhost-data"),
        description="Where the database, request payloads, results and (unless HF_HOME is set) "
        "the model cache live.",
    )
    database: Annotated[Optional[str], Flag(metavar="URL"), Shown("`DATA_DIR/nnhost.sqlite3`")] = Field(
        None,
        description="Where jobs, users and keys are kept: sqlite:///PATH, or "
        "postgresql://USER:PASSWORD@HOST:PORT/NAME for a PostgreSQL server (through psycopg 3 "
        "and a connection pool).",
    )
    # On the command line: the positional MODEL_IDs of `nnhost serve`.
    models: Names = Field(
        default_factory=list,
        description='Repo ids served (each may be "org/name" or "org/name@revision"); on the '
        "command line, the MODEL_IDs of nnhost serve.",
    )
    demo: Annotated[bool, Flag()] = Field(False, description="Build and serve the offline demo model.")
    api_key: Annotated[Optional[str], Flag()] = Field(
        None, description="A key to accept for the admin user (else one is generated on first start)."
    )
    public_url: Annotated[Optional[str], Flag()] = Field(
        None,
        description="Public base URL clients reach the server at, when that is not the address "
        "it binds (behind a proxy, say): result links and the printed export lines use it (else "
        "taken from the request).",
    )
    time_limit: Annotated[Duration, Flag()] = Field(
        3600.0,
        gt=0,
        description="How long one request may run (more than 0): seconds, or e.g. 30m. Past it "
        "the request is interrupted and the user gets an error saying so.",
    )
    kill_grace: Annotated[Duration, Flag()] = Field(
        10.0,
        description="Seconds past the time limit before code that ignores the interrupt is "
        "killed (and its worker restarted).",
    )
    job_start_timeout: Duration = Field(
        120.0,
        gt=0,
        description="Seconds a replica waits for a job process it asked for to be ready (forked, "
        "contained, its weights bound). Past it the replica reports itself unhealthy, the server "
        "log shows what each waiting process was doing, and the model is started afresh; after 3 "
        "such starts the jobs waiting for it end with an ERROR that says why (the next request "
        "tries again).",
    )
    inline_result_bytes: Size = Field(
        1 * MiB,
        description="Results up to this size ride inline on the websocket; larger ones go by link.",
    )
    max_result_bytes: Size = Field(4096 * MiB, description="Largest result kept (0: no limit).")
    max_request_bytes: Size = Field(
        256 * MiB, description="Largest request body accepted (a larger one gets 413, unread)."
    )
    result_retention: Duration = Field(
        24 * 3600.0, description="Seconds a result (and the job's LOG lines) stays downloadable."
    )
    results: Annotated[
        Optional[str], Flag(metavar="DIR|s3://BUCKET[/PREFIX]"), Shown("`DATA_DIR/results`")
    ] = Field(
        None,
        description="Where results are kept: a directory (in a cluster, one all machines "
        "share) or s3://BUCKET[/PREFIX] (credentials from the AWS environment).",
    )
    results_endpoint: Annotated[Optional[str], Flag(metavar="URL"), Shown("none (AWS)")] = Field(
        None,
        description="URL of an S3-compatible endpoint (MinIO, Ceph, ...) for s3:// results, e.g. "
        "http://minio:9000.",
    )
    jobs_at_once: Annotated[int, Flag()] = Field(
        0,
        ge=0,
        description="Jobs one replica runs at once, each in its own process (0: half the cores, "
        "at least 2, for a model on the CPU; 1 on an accelerator, where each job's activations "
        "take the device's memory). Trusted mode, one process for every job, runs one at a time.",
    )
    jobs_per_process: Annotated[int, Flag()] = Field(
        50,
        ge=1,
        description="Jobs of one user a job's process may run, one after another, stopped in "
        "between (1: a fresh process for every job). Another user's job never runs in it.",
    )
    torch_threads: Annotated[int, Flag()] = Field(
        0,
        ge=0,
        description="Threads torch may use in each job (0: the cores less one for the API, "
        "split between all the jobs the replicas run at once, at least 1 each, so that jobs under "
        "load do not oversubscribe the cores).",
    )
    max_log_lines: int = Field(
        10_000,
        ge=0,
        description="Largest number of LOG lines kept and forwarded from one job; past it, one "
        "notice line says the rest was dropped.",
    )
    max_log_bytes: Size = Field(
        1 * MiB,
        description="Largest total size of the LOG lines kept and forwarded from one job; past "
        "it, one notice line says the rest was dropped.",
    )
    client_versions: Annotated[
        Names,
        Shown("every version this installation serves: `0.8.1`, and `0.8.0`, `0.7.0`, `0.6.3` "
              "once their runtimes are built"),
    ] = Field(
        default_factory=lambda: list(served_client_versions()),
        description="nnsight client versions served, each with the code of its own version; any "
        "other is refused with text naming these and the pip install nnsight==... that works (a "
        "release's pre-, post- and dev releases are its own).",
    )
    runtime_idle_seconds: Duration = Field(
        600.0,
        ge=0,
        description="Seconds a runtime of another nnsight version than the server's own may go "
        "without a job before its template stops (the next job of that version starts it again); "
        "0 keeps it.",
    )
    hub_serve_weights: bool = Field(
        False, description="Serve weight files from the Hub mirror as well as configs and tokenizers."
    )
    catalog: Annotated[list[ModelEntry], BeforeValidator(_json)] = Field(
        default_factory=list,
        description="Models served, with their load options, from nnhost.toml's [[model]] tables.",
    )
    allow: Annotated[list[AllowEntry], BeforeValidator(_json)] = Field(
        default_factory=list,
        description="Models fetched from the Hub (HF_ENDPOINT, HF_TOKEN) on first request, from "
        "nnhost.toml's [[allow]] tables (repo-id pattern, max_size, dtype, device; see Models on "
        "demand in docs/deploying.md).",
    )
    download_budget: Size = Field(
        0,
        description="Disk the models fetched on demand may take together; the least recently "
        "used is deleted to make room (0: no limit). Listed models never count or go.",
    )
    memory_budget: Annotated[
        dict[str, Size], BeforeValidator(_pairs), Flag(metavar="DEVICE=SIZE")
    ] = Field(
        default_factory=dict,
        description="Memory HOT models may use per device, e.g. cpu=8GiB (as a flag: repeatable), "
        'held as bytes. Not listed, "cpu" gets 80% of this machine\'s memory and a GPU a model '
        "uses 90% of its free memory (asked at start); any other device is unbounded.",
    )
    memory_margin: float = Field(
        0.25,
        ge=0,
        description="Extra memory reserved per replica on top of its weights, as a fraction of "
        "them (for activations, the KV cache and slack).",
    )
    allow_trust_remote_code: bool = Field(
        False, description="Allow catalog models that need trust_remote_code."
    )
    scale_down_after: Duration = Field(
        300.0,
        description="Seconds an extra replica (beyond a model's replicas, up to its max_replicas) "
        "stays idle before it is stopped.",
    )
    scale_up_after: Duration = Field(
        5.0,
        description="Seconds a model's oldest queued job waits before another replica is "
        "started (up to its max_replicas, where a device or Ray node has room).",
    )
    shutdown_grace: Duration = Field(
        30.0,
        description="Seconds a graceful shutdown (SIGTERM) waits for running jobs before "
        "requeueing them.",
    )
    auth: Annotated[Literal["keys", "none"], Flag()] = Field(
        "keys",
        description="'keys': every API call needs a key. 'none': no API keys, every request is "
        "the local admin; refused on a non-loopback address unless allow_insecure is set.",
    )
    allow_insecure: Annotated[bool, Flag()] = Field(
        False, description="Allow auth none (--auth none) on a non-loopback address."
    )
    signup: Annotated[Literal["open", "invite", "closed"], Flag()] = Field(
        "open",
        description="Who may make an account on the web pages: open, invite (a code from the "
        "CLI) or closed.",
    )
    cluster: Annotated[Optional[str], Flag(metavar="ADDRESS")] = Field(
        None,
        description="Where replicas run: none (processes on this machine), or a Ray cluster: "
        "auto (the one this machine is in), or its address (HOST:PORT). Needs pip install "
        "nnhost[cluster].",
    )
    events: Annotated[Optional[str], Flag(metavar="URL")] = Field(
        None,
        description="Where job updates travel between processes: none (in this process) or "
        "Redis (redis://HOST:PORT[/DB], rediss://... or unix://PATH), so that a websocket on one "
        "API process gets the updates another publishes. Needed by role api and controller.",
    )
    role: Annotated[Literal["all", "api", "controller"], Flag()] = Field(
        "all",
        description="What this process does: all (everything, one process); api (requests, "
        "websockets and results; never runs models); controller (the queue, the deployments "
        "and the replicas; one acts at a time, others stand by). api and controller processes "
        "share --database, --events and --results.",
    )
    log_format: Annotated[Literal["text", "json"], Flag()] = Field(
        "text",
        description="Server log lines: text, or json (one object per line, with job and "
        "request ids).",
    )
    session_ttl: Duration = Field(14 * 24 * 3600.0, description="Seconds a web login lasts.")
    limits: Annotated[dict[str, Any], BeforeValidator(_json)] = Field(
        default_factory=dict,
        description="Per-tag limits, from nnhost.toml's [limits.TAG] tables; as an environment "
        "variable, a JSON object.",
    )
    auth_failure_limit: int = Field(
        30,
        ge=0,
        description="Failed API key (or password) attempts one client address may make per "
        "window before its further failures get 429 (a valid key always works).",
    )
    auth_failure_window: Duration = Field(300.0, description="Seconds of that window.")
    signups_per_address: int = Field(
        10,
        ge=0,
        description="Accounts one client address may make an hour through the sign-up page "
        "(0: no limit).",
    )
    metrics_access: Literal["key", "public"] = Field(
        "key", description='Who may read /metrics: "key" (a key tagged admin or metrics) or "public".'
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Connections (websockets included) one server process holds at once. A "
        "newcomer past it closes the connection that has waited longest for a request's head; "
        "if every one is in use, it gets 503. Lowered to fit the descriptor limit, less "
        "descriptor_reserve.",
    )
    max_connections_per_address: int = Field(
        256,
        ge=1,
        description="Connections one client address holds at once; past it that address's "
        "longest-waiting one is closed, or the newcomer gets 503. Proxies named in "
        "forwarded_allow_ips are exempt (cap them there).",
    )
    descriptor_reserve: int = Field(
        1024,
        ge=32,
        description="File descriptors kept out of reach of connections, for the server's own "
        "files, database and workers (at most half the descriptor limit); half of it bounds how "
        "many connections are accepted at once.",
    )
    request_head_timeout: Duration = Field(
        20.0,
        gt=0,
        description="Seconds a request's line and headers may take to arrive (counted from the "
        "connection, or from the previous answer); past it, 408 and close.",
    )
    request_body_timeout: Duration = Field(
        300.0,
        gt=0,
        description="Seconds a request's body may take to arrive once its headers are in; past "
        "it the connection is closed. Raise it for payloads near max_request_bytes on slow links.",
    )
    forwarded_allow_ips: Annotated[Names, Flag(metavar="ADDRESSES")] = Field(
        default_factory=list,
        description="Proxies whose X-Forwarded-For / X-Forwarded-Proto headers are believed "
        '(addresses or networks, comma-separated, or "*"). None by default, loopback included: '
        "without it a client's address is the one that connected.",
    )
    containment: bool = Field(
        True,
        description="Contain user code (restricted unpickling, import allowlist, read-only "
        "weights, OS-level layers; see docs/security.md). false only for trusted deployments.",
    )
    execution: Literal["auto", "fork", "mapped"] = Field(
        "auto",
        description='How contained jobs run: "fork" (each job\'s process forked from the process '
        'holding the weights), "mapped" (forked from a template without weights, mapping them '
        'by handle), or "auto" (fork on the CPU; an accelerator runs its jobs in-process). See '
        "docs/security.md.",
    )
    spare_hosts: int = Field(
        1,
        ge=0,
        le=8,
        description="Host processes kept started and prepared (libraries imported, and in the "
        "mapped design their template too) so that a cold start only loads the weights; each "
        "holds a few hundred MB of memory (0: none).",
    )
    allowed_imports: Names = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_IMPORTS),
        description="Top-level modules user code may import (nnsight is always allowed).",
    )
    job_memory_bytes: Size = Field(
        0, description="Memory one job may use on top of the loaded worker (0: 8 GiB)."
    )
    scratch_bytes: Size = Field(
        256 * MiB, description="Size of the private scratch space (/tmp) of a contained worker."
    )
    worker_uid_base: int = Field(
        200_000, ge=1, description="Contained workers run as uid/gid worker_uid_base + their pid."
    )
    hidden_paths: Names = Field(
        default_factory=list,
        description="More paths a contained worker must not see (the data dir and model cache "
        "always are).",
    )
    unsafe_test_hooks: bool = Field(
        False,
        description="TESTS ONLY, never in production: a job's process runs raw, unrestricted "
        "Python prefixed to a payload (tests/security/test_isolation.py plays a user who beat "
        "the sandbox).",
    )

    @field_validator("client_versions")
    @classmethod
    def _client_versions(cls, value: list[str]) -> list[str]:
        from .runtimes import RUNTIME_VERSIONS

        served = served_client_versions()
        unknown = [name for name in value if name not in served]
        if unknown or not value:
            buildable = [name for name in unknown if name in RUNTIME_VERSIONS]
            hint = (f" (`nnhost runtimes {' '.join(buildable)}` builds "
                    f"{'its runtime' if len(buildable) == 1 else 'their runtimes'})" if buildable else "")
            raise ValueError(
                f"{', '.join(unknown) or 'an empty list'}: this installation serves nnsight "
                f"clients {', '.join(served)}; name one or more of those{hint}"
            )
        return value

    @field_validator("limits")
    @classmethod
    def _limits(cls, tables: dict[str, Any]) -> dict[str, Any]:
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
    def _endpoint(cls, value: Optional[str]) -> Optional[str]:
        from urllib.parse import urlsplit

        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "use the endpoint's URL, e.g. http://127.0.0.1:9000 or https://s3.example.org"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _together(self) -> Settings:
        """The checks that involve more than one setting (each one is valid alone by now)."""
        conflict = SettingConflict()
        if self.results_endpoint is not None and not (self.results or "").startswith("s3://"):
            conflict.add(
                'an endpoint is only used with s3:// results; set results = "s3://BUCKET" too',
                "results_endpoint", self.results_endpoint,
            )
        if self.role != "all" and not self.events:
            conflict.add(
                f"--role {self.role} needs --events redis://HOST:PORT (the same for every "
                "process): a job's updates travel from the controller to the API process that "
                "holds its websocket."
            )
        if conflict.problems:
            raise conflict
        return self

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
_TOML_VALUES: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("nnhost_toml", default={})  # noqa: B039 (read, never mutated)


class _TomlSource(PydanticBaseSettingsSource):
    def get_field_value(  # pragma: no cover - __call__ is used
        self, field: FieldInfo, field_name: str
    ) -> tuple[Any, str, bool]:
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
    path = Path(config_file) if config_file is not None else Path(data_dir).expanduser() / "nnhost.toml"
    toml: dict[str, Any] = {}
    if config_file is not None and not path.is_file():
        problems.append(f"--config {path}: no such file")
    elif path.is_file():
        toml = read_toml(path)
    if problems:
        raise SettingsError("\n".join(problems))
    token = _TOML_VALUES.set(toml)
    try:
        return Settings(**flags)
    except ValidationError as error:
        where = Origins(flags, environ, toml, path)
        raise SettingsError(
            "\n".join(
                describe(item, where, Settings.model_fields,
                         {"catalog": ModelEntry.model_fields, "allow": AllowEntry.model_fields})
                for item in error.errors()
            )
        ) from None
    finally:
        _TOML_VALUES.reset(token)

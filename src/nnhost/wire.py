"""The client's message shapes, defined on our side of the wire.

The nnsight client sends a JSON envelope (`RequestEnvelope`, its
``RequestModel``) and reads status updates (`Response`, its ``ResponseModel``),
either as JSON text or, when a result rides along, as ``torch.save`` bytes of
the response's dict (pickle protocol 4).

The API process defines these itself rather than importing nnsight: importing
nnsight mounts a ``.save`` attribute on every Python object in the process,
which is the client's convenience but breaks libraries the server relies on
(anyio refuses to build classes that suddenly have an unannotated attribute).
Only the worker processes, which run user code, import nnsight.
"""

from __future__ import annotations

import io
import json
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: The most a request's ``env`` may hold, as JSON. It travels with the job's
#: hand-off message to the job's process (`execution.channel.MAX_MESSAGE`,
#: 256 KiB, holds it and the rest of the job); what nnsight puts there (a
#: PEFT adapter's name, say) is a few hundred bytes.
MAX_ENV_BYTES = 64 * 1024


class RequestEnvelope(BaseModel):
    """The ``data`` form field of ``POST /request``."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    model_key: str
    session_id: str = ""
    compress: bool = False
    env: dict[str, Any] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _small_env(cls, env: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(env, separators=(",", ":"), default=str))
        if size > MAX_ENV_BYTES:
            raise ValueError(
                f"the request's env is {size:,} bytes of JSON, over this server's limit of "
                f"{MAX_ENV_BYTES:,}: it holds the model's settings for the request (a PEFT "
                "adapter's name), not data; send data in the trace itself"
            )
        return env


class Response(BaseModel):
    """One status update for a job, as the client parses it."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    id: str
    status: str
    description: str = ""
    data: Optional[Any] = None
    meta: Optional[dict[Any, Any]] = None

    def pickle(self) -> bytes:
        """``torch.save`` of the fields, as the client's binary-frame parser expects."""
        import torch

        buffer = io.BytesIO()
        torch.save(self.model_dump(), buffer, pickle_protocol=4)
        return buffer.getvalue()

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
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field


class RequestEnvelope(BaseModel):
    """The ``data`` form field of ``POST /request``."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    model_key: str
    session_id: str = ""
    compress: bool = False
    env: dict[str, Any] = Field(default_factory=dict)


class Response(BaseModel):
    """One status update for a job, as the client parses it."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    id: str
    status: str
    description: str = ""
    data: Optional[Any] = None
    meta: Optional[dict] = None

    def pickle(self) -> bytes:
        """``torch.save`` of the fields, as the client's binary-frame parser expects."""
        import torch

        buffer = io.BytesIO()
        torch.save(self.model_dump(), buffer, pickle_protocol=4)
        return buffer.getvalue()

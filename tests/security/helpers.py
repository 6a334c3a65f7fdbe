"""Helpers for the escape suite: a normal request, raw posts, waiting for a job."""

from __future__ import annotations

import json
import time
from typing import Optional

import httpx
from compare import assert_same
from conftest import API_KEY, TEST_REPO

PROMPT = "The Eiffel Tower is in the city of"
MODEL_KEY = (
    'nnsight.modeling.transformers.TransformersModel:{"repo_id": "%s", '
    '"revision": null, "task": "text-generation"}' % TEST_REPO
)
HEADERS = {"ndif-api-key": API_KEY, "nnsight-version": "0.8.1"}


def headers_for(server, key: str = API_KEY) -> dict:
    """A raw request's headers: it names the nnsight version whose runtime ``server`` is tested with."""
    return {"ndif-api-key": key, "nnsight-version": getattr(server, "client_version", "0.8.1")}


def normal_program(model, remote):
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].mlp.output.save()
        logits = model.lm_head.output.save()
    return {"hidden": hidden, "logits": logits}


def assert_serving(server, remote_model, local_reference) -> None:
    server.wait_running(180)
    assert_same(normal_program(remote_model, server.url), local_reference)


def post(server, blob: bytes, *, compress: bool = False, data: Optional[str] = None,
         headers: Optional[dict] = None, timeout: float = 30) -> httpx.Response:
    envelope = data if data is not None else json.dumps({"model_key": MODEL_KEY, "compress": compress})
    return httpx.post(
        f"{server.url}/request",
        data={"data": envelope},
        files={"blob": ("request", blob, "application/octet-stream")},
        headers={**headers_for(server), **(headers or {})},
        timeout=timeout,
    )


def wait_final(server, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    latest: dict = {}
    while time.monotonic() < deadline:
        latest = httpx.get(f"{server.url}/response/{job_id}", headers=HEADERS, timeout=10).json()
        if latest.get("status") in ("COMPLETED", "ERROR"):
            return latest
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {latest}")


def run_blob(server, blob: bytes, compress: bool = False) -> dict:
    response = post(server, blob, compress=compress)
    assert response.status_code == 200, response.text
    return wait_final(server, response.json()["id"])


class _Capture:
    """A backend that serializes the trace instead of sending it."""

    def __init__(self, compress: bool) -> None:
        self.compress = compress
        self.blob = b""

    def __call__(self, tracer) -> None:
        from nnsight.schema.request import RequestModel

        self.blob = RequestModel.serialize(tracer, self.compress)


def serialized_request(model, compress: bool = False) -> bytes:
    """The payload the client would send for a small, normal trace."""
    capture = _Capture(compress)
    with model.trace(PROMPT, backend=capture):
        logits = model.lm_head.output.save()
    return capture.blob

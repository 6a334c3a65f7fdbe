"""Running raw, unrestricted Python in a job's process: a user who already beat the Python layer.

Only a server started with the ``unsafe_test_hooks`` setting runs this prefix
(an operator setting; nothing in a request can turn it on). A hostile snippet
reports what it found by `report(value)`: an ERROR event whose description is
``REPORT`` and a JSON value, after which its process ends.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
import time

import httpx

from nnhost.execution.job.process import TEST_MAGIC, TEST_SEPARATOR

from .helpers import MODEL_KEY, headers_for, serialized_request

PRELUDE = textwrap.dedent(
    """
    import json as _json, os as _os

    def report(value):
        channel.send({"type": "event", "job_id": spec.job_id, "status": "ERROR",
                      "description": "REPORT" + _json.dumps(value, default=repr)})
        _os._exit(0)
    """
)



def submit_hostile(server, key: str, source: str, remote_model) -> str:
    blob = TEST_MAGIC + (PRELUDE + textwrap.dedent(source)).encode() + TEST_SEPARATOR
    blob += serialized_request(remote_model)
    response = httpx.post(
        f"{server.url}/request",
        data={"data": json.dumps({"model_key": MODEL_KEY, "compress": False})},
        files={"blob": ("request", blob, "application/octet-stream")},
        headers=headers_for(server, key),
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()["id"]


def hostile(server, key: str, source: str, remote_model) -> dict:
    job_id = submit_hostile(server, key, source, remote_model)
    final = wait_for(server, key, job_id)
    final["id"] = job_id
    return final


def wait_for(server, key, job_id, timeout=60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = httpx.get(f"{server.url}/response/{job_id}", headers={"ndif-api-key": key}, timeout=10).json()
        if latest.get("status") in ("COMPLETED", "ERROR"):
            return latest
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")


def reported(final: dict):
    description = final.get("description", "")
    assert description.startswith("REPORT"), final
    return json.loads(description[len("REPORT"):])


def job_logs(server, job_id: str) -> list[str]:
    connection = sqlite3.connect(f"file:{server.data_dir / 'nnhost.sqlite3'}?mode=ro", uri=True)
    try:
        return [row[0] for row in connection.execute(
            "SELECT line FROM job_logs WHERE job_id = ? ORDER BY rowid", (job_id,))]
    finally:
        connection.close()

"""Requests made by real nnsight 0.8.1 clients on Python 3.10, 3.12 and 3.13.

The server runs on its own Python; a client ships the classes of its script
as its own Python pickles them, and a newer Python records more than an
older one reads (a 3.12 dataclass's ``match_args``, a 3.13 dataclass's
``__replace__`` and its ``__repr__``'s thread-id key). Each file under
``tests/data/client_pythons`` was recorded by `client_pythons/record.py` with
a real client on that Python (its blob exactly as the client POSTed it, and
the description of the same program's local result on that client); here
each request goes to the server again, with the client's own headers, and
what comes back must describe the same as the local run did.

The programs cover the user's script's dataclasses (frozen, ordered,
keyword-only with slots), enums with methods, named tuples, typing
constructs, descriptors and class attributes, and values whose class was made
while the job ran (named tuples, ``make_dataclass``, the enum functional API,
class statements inside a helper, under ``from __future__ import
annotations``).

A class the client shipped goes back as the id the client's cloudpickle knows
it by; this process is not that client, so those values are compared by name
and contents (``deep=False``): the recording script checked, on the client
itself, that they come back as its own classes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from conftest import API_KEY

sys.path.insert(0, str(Path(__file__).resolve().parent / "client_pythons"))
from describe import describe, same  # noqa: E402

RECORDINGS = sorted((Path(__file__).resolve().parent / "data" / "client_pythons").glob("python-*.pt"))
CASES = [
    (path, name)
    for path in RECORDINGS
    for name in torch.load(path, weights_only=False)["programs"]  # our own recordings
]


def test_every_client_python_was_recorded():
    assert [path.stem for path in RECORDINGS] == ["python-3.10", "python-3.12", "python-3.13"]


def _replay(server, record: dict, program: dict) -> dict:
    envelope = json.loads(program["data"])
    envelope["session_id"] = ""  # polled, not streamed: the same job without a websocket
    headers = {
        "ndif-api-key": API_KEY,
        "nnsight-version": record["nnsight"],
        "python-version": record["python"],
    }
    submitted = httpx.post(
        f"{server.url}/request",
        data={"data": json.dumps(envelope)},
        files={"blob": ("request", program["blob"], "application/octet-stream")},
        headers=headers,
    )
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        latest = httpx.get(f"{server.url}/response/{job_id}", headers=headers).json()
        if latest["status"] in ("COMPLETED", "ERROR"):
            break
        time.sleep(0.1)
    assert latest["status"] == "COMPLETED", latest["description"]
    content = httpx.get(latest["data"]).content
    if envelope.get("compress"):
        import zstandard

        content = zstandard.ZstdDecompressor().decompress(content)
    import io

    return torch.load(io.BytesIO(content), map_location="cpu", weights_only=False)


@pytest.mark.parametrize("path,name", CASES, ids=[f"{path.stem}-{name}" for path, name in CASES])
def test_a_recorded_request_gives_what_its_client_gave_locally(path, name, server):
    record = torch.load(path, weights_only=False)  # our own recording
    program = record["programs"][name]
    result = _replay(server, record, program)
    expected = {key[1]: value for key, value in program["expected"][2]}
    assert sorted(result) == sorted(expected)
    for key, value in result.items():
        same(describe(value, program["kind"] == "made"), expected[key], f"{path.stem} {name} {key}")

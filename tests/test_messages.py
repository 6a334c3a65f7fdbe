"""What crosses between the controller and the API processes is a declared type, checked once.

Job updates (the event bus), commands and their answers (the database's
command rows) and the board (published to the database) are written by
another process: each is a pydantic model, and a malformed one is refused
with an error that says what is wrong, before anything acts on it.
"""

from __future__ import annotations

import json

import pytest

from nnhost.jobs.update import MAGIC, JobUpdate


def header(**fields) -> bytes:
    base = {"job_id": "a" * 32, "status": "RUNNING", "description": "running", "inline": False}
    return MAGIC + json.dumps({**base, **fields}).encode() + b"\n"


def test_an_update_survives_its_encoding():
    update = JobUpdate(job_id="a" * 32, status="COMPLETED", description="done",
                       meta={"runtime": 1.5}, base_url="http://x", result_expires_at=10.0,
                       inline=b"result\nwith a newline")
    assert JobUpdate.decode(update.encode()) == update
    plain = JobUpdate(job_id="b1", status="QUEUED", description="queued")
    assert JobUpdate.decode(plain.encode()) == plain and plain.inline is None


@pytest.mark.parametrize("frame, says", [
    ("not bytes", "not a job update"),
    (b"something else", "not a job update"),
    (MAGIC + b"{not json\n", "not JSON"),
    (MAGIC + b"[1, 2]\n", "not an object"),
    (header(inline="yes"), "inline flag"),
    (header(job_id="../../etc/passwd"), "job_id"),
    (header(job_id=12345), "job_id"),
    (header(status="PWNED"), "status"),
    (header(status=["RUNNING"]), "status"),
    (header(description=None), "description"),
    (header(meta=[1]), "meta"),
    (header(result_expires_at="soon"), "result_expires_at"),
    (header(bogus=1), "bogus"),
    (MAGIC + json.dumps({"job_id": "a1", "description": ""}).encode() + b"\n", "status"),
])
def test_a_malformed_update_is_refused_saying_why(frame, says):
    with pytest.raises(ValueError, match="job update") as refused:
        JobUpdate.decode(frame)
    assert says in str(refused.value)


def test_an_update_is_checked_when_it_is_built_too():
    with pytest.raises(ValueError, match="status"):
        JobUpdate(job_id="a1", status="PWNED", description="")

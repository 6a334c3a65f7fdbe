"""What crosses between the controller and the API processes is a declared type, checked once.

Job updates (the event bus), commands and their answers (the database's
command rows) and the board (published to the database) are written by
another process: each is a pydantic model, and a malformed one is refused
with an error that says what is wrong, before anything acts on it.
"""

from __future__ import annotations

import json

import pytest

from nnhost.jobs.messages import (
    Board,
    Cancel,
    Deploy,
    Deployed,
    Done,
    Evict,
    MalformedMessage,
    Refusal,
    answer_text,
    command_row,
    parse_command,
    read_answer,
)
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


def test_a_command_survives_its_row():
    for command in (Deploy(model="org/a", level="warm"), Evict(model="org/a"), Cancel(job_id="a" * 32)):
        kind, args = command_row(command)
        assert kind == command.type and "type" not in json.loads(args)
        assert parse_command(kind, args) == command
    assert parse_command("deploy", {"model": "org/a"}) == Deploy(model="org/a", level="hot")


@pytest.mark.parametrize("kind, args, says", [
    ("reboot", "{}", "Unknown command 'reboot'"),
    (None, "{}", "Unknown command None"),
    ("evict", "[1, 2]", "not an object"),
    ("evict", "{not json", "not JSON"),
    ("evict", {"model": "org/a", "bogus": 1}, "bogus"),
    ("evict", {}, "model"),
    ("evict", {"model": 7}, "model"),
    ("deploy", {"model": "org/a", "level": ["hot"]}, "level"),
    ("cancel", {"job_id": "../../etc/passwd"}, "job_id"),
    ("cancel", {"job_id": "a1", "type": "evict"}, "'type' is not an argument"),
])
def test_a_malformed_command_is_refused_saying_why(kind, args, says):
    with pytest.raises(MalformedMessage) as refused:
        parse_command(kind, args)
    assert says in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_an_answer_is_the_commands_result_or_a_refusal():
    deploy = Deploy(model="org/a")
    done = Done(ok=Deployed(model="org/a", target="HOT", note="").model_dump())
    assert read_answer(answer_text(done), deploy) == Deployed(model="org/a", target="HOT", note="")
    refusal = Refusal(refused=(409, "busy"))
    assert read_answer(answer_text(refusal), deploy) == refusal
    # The row's format is the one earlier versions wrote.
    assert json.loads(answer_text(refusal)) == {"refused": [409, "busy"]}


@pytest.mark.parametrize("raw, says", [
    (None, "Invalid JSON"),
    ("{not json", "Invalid JSON"),
    ("[1, 2]", "answer is malformed"),
    ('{"refused": [200, "fine"]}', "greater than or equal to 400"),
    ('{"refused": ["404", "no"]}', "refused.0"),
    ('{"refused": [404]}', "refused"),
    ('{"ok": {"model": "org/a"}, "refused": [404, "no"]}', "Extra inputs"),
    ('{"ok": {"model": "org/a", "target": "HOT"}}', "answer to deploy is malformed: note"),
    ('{"ok": {"id": "a1", "cancelled": true}}', "answer to deploy is malformed"),
])
def test_a_malformed_answer_is_refused_saying_why(raw, says):
    with pytest.raises(MalformedMessage) as refused:
        read_answer(raw, Deploy(model="org/a"))
    assert says in str(refused.value)


def model_entry(**fields) -> dict:
    entry = {
        "name": "org/a", "repo_id": "org/a", "level": "HOT", "target": "HOT", "state": "RUNNING",
        "replicas": {"total": 1, "running": 1, "configured": 1, "most": 1, "by_state": {"RUNNING": 1}},
        "queued": 0, "running": 0, "incidents": {}, "containment": None, "description": "",
        "note": "",
    }
    return {**entry, **fields}


def test_a_board_survives_its_publication_key_for_key():
    board = Board.model_validate({
        "models": [model_entry()],
        "devices": {"cpu": {"budget_bytes": 1 << 30, "used_bytes": 0}},
        "nodes": {"n1": {"address": "10.0.0.1", "budget_bytes": 8, "used_bytes": 0, "cpus": 4.0,
                         "cpus_used": 1, "gpus": 0, "gpus_used": 0, "replicas": []}},
        "per_minute": [{"completed": 1, "errors": 0}],
    })
    read = Board.read(board.text())
    assert read == board and not read.stale
    # A key the controller did not give is not served as null (the recent-jobs medians).
    assert "median_wait_seconds" not in read.model_dump()["models"][0]
    with_medians = Board.model_validate({"models": [model_entry(median_wait_seconds=None, median_run_seconds=1,
                                                    completed=1, errors=0)]})
    served = Board.read(with_medians.text()).model_dump()["models"][0]
    assert served["median_wait_seconds"] is None and served["median_run_seconds"] == 1
    # In the order the pages have always had them: the medians after the incidents.
    assert list(served) == [
        "name", "repo_id", "level", "target", "state", "replicas", "queued", "running",
        "incidents", "median_wait_seconds", "median_run_seconds", "completed", "errors",
        "containment", "description", "note",
    ]
    # Numbers stay as measured: an int is not served as a float, nor a float as an int.
    node = read.model_dump()["nodes"]["n1"]
    assert node["cpus"] == 4.0 and isinstance(node["cpus"], float) and isinstance(node["cpus_used"], int)


@pytest.mark.parametrize("raw, says", [
    ("{not json", "Invalid JSON"),
    ("[]", "should be an object"),
    (json.dumps({"models": [{"name": "org/a"}]}), "models.0.repo_id"),
    (json.dumps({"models": [model_entry(queued="many")]}), "models.0.queued"),
    (json.dumps({"models": [model_entry(owner="ada@example.org")]}), "models.0.owner"),
    (json.dumps({"devices": {"cpu": {"budget_bytes": 1}}}), "devices.cpu.used_bytes"),
    (json.dumps({"deployments": {"org/a": {"deployment": "org/a"}}}), "deployments.org/a"),
    (json.dumps({"per_minute": [{"completed": 1}]}), "per_minute.0.errors"),
    (json.dumps({"draining": "no"}), "draining"),
])
def test_a_malformed_board_is_refused_saying_why(raw, says):
    with pytest.raises(MalformedMessage, match="board is malformed") as refused:
        Board.read(raw)
    assert says in str(refused.value)


@pytest.mark.parametrize("raw", [b"{not json", b"{}", b'{"user_id": "3"}', b'{"user_id": true}',
                                 b'{"user_id": 3, "admin": true}'])
def test_a_malformed_session_owner_record_is_refused(raw):
    from pydantic import ValidationError

    from nnhost.jobs.bus_redis import SessionOwner

    assert SessionOwner.model_validate_json(b'{"user_id": 3}').user_id == 3
    assert SessionOwner.model_validate_json(b'{"user_id": null}').user_id is None
    with pytest.raises(ValidationError):
        SessionOwner.model_validate_json(raw)

"""What crosses between a replica and its processes is a declared type, read in one place.

Every message on a replica's channels (`execution.messages`) is a pydantic
model discriminated by ``type``; each receiver reads with the `Kinds` of what
its sender may send, and gets the typed message or a `BadMessage` whose words
complete "it sent ...". What a job's process sends is held to the event rules
of `execution.events`, refused in their own words.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from nnhost.execution.channel import BadMessage, Channel, pair
from nnhost.execution.events import MAX_DESCRIPTION_CHARS, JobEvent, JobSpec, event_problem
from nnhost.execution.handoff import receive_job, send_job
from nnhost.execution.messages import (
    FROM_HOST,
    FROM_JOB,
    FROM_RAY_ACTOR,
    TO_HOST,
    TO_JOB,
    Discard,
    Event,
    Exit,
    Fork,
    Message,
    Options,
    Place,
    Prepare,
    RayIdle,
    RayIncident,
    RayJobEvent,
    Ready,
    Slot,
    State,
    Stop,
    Weights,
)
from nnhost.execution.policy import WorkerOptions, WorkerPolicy


@pytest.fixture
def channels():
    left, right = pair()
    yield Channel(left), Channel(right)
    left.close()
    right.close()


CONTROL: list[Message] = [
    Prepare(environ={"HOME": "/root"}),
    Prepare(environ={}, policy=WorkerPolicy(allowed_imports=["math"], job_start_timeout=5.0)),
    Options(options=WorkerOptions("org/model", load_kwargs={"revision": "main"}, torch_threads=2)),
    Weights(tensors=3),
    Fork(memory_cgroup=True),
    Discard(pid=1234),
    Place(device="cuda:0"),
    Stop(),
]
REPORTS: list[Message] = [
    State(state="RUNNING", description="Loaded.", weight_bytes=10, containment={"active": ["seccomp"]}),
    State(state="READY"),
    Slot(pid=7, reusable=False, pid_namespace=True),
    Exit(pid=7, status=-9),
]


@pytest.mark.parametrize("message", CONTROL + REPORTS, ids=lambda message: type(message).__name__)
def test_each_message_arrives_as_it_was_sent(channels, message):
    sender, receiver = channels
    kinds = TO_HOST if message in CONTROL else FROM_HOST
    sender.send(message)
    received, fds = kinds.receive(receiver)
    assert received == message and type(received) is type(message) and fds == []


def test_the_policy_is_rebuilt_by_the_dataclass_itself(channels):
    sender, receiver = channels
    sender.send(Prepare(environ={}, policy=WorkerPolicy(containment=False)))
    received, _ = TO_HOST.receive(receiver)
    assert isinstance(received, Prepare) and received.policy is not None
    # `WorkerPolicy.__post_init__` ran: the limits are a dataclass again, switched off with it.
    assert received.policy.limits.enabled is False


def test_a_job_travels_with_its_files_and_without_its_paths(tmp_path, channels):
    sender, receiver = channels
    payload, result = tmp_path / "payload", tmp_path / "result"
    payload.write_bytes(b"trace")
    spec = JobSpec("job0", str(payload), False, result_path=str(result), time_limit=9.0)
    send_job(sender, spec)
    run, fds = TO_JOB.receive(receiver)
    assert run is not None and run.job.payload_path == "" and run.job.result_path == ""
    got = receive_job(run, fds)
    try:
        assert got.job_id == "job0" and got.time_limit == 9.0
        assert os.read(got.payload_fd, 100) == b"trace"
        os.write(got.result_fd, b"done")
        assert result.read_bytes() == b"done"
    finally:
        os.close(got.payload_fd)
        os.close(got.result_fd)


def test_a_job_process_may_send_only_ready_and_events(channels):
    sender, receiver = channels
    sender.send(Ready(containment={"active": []}))
    sender.send(Event.of(JobEvent("job0", "LOG", "a line \ud800 a job printed")))
    ready, _ = FROM_JOB.receive(receiver)
    event, _ = FROM_JOB.receive(receiver)
    assert isinstance(ready, Ready) and isinstance(event, Event)
    assert event.job_event() == JobEvent("job0", "LOG", "a line \ud800 a job printed")
    for raw, why in [
        ({"type": "idle", "job_id": "job0"}, "an unexpected message ('idle')"),
        ({"type": "slot", "pid": 1, "reusable": True}, "an unexpected message ('slot')"),
        ({"job_id": "job0"}, "an unexpected message (None)"),
        ({"type": "ready", "containment": 3}, "a malformed ready message (containment:"),
        ({"type": "ready", "extra": 1}, "a malformed ready message (extra:"),
    ]:
        sender.send(raw)
        with pytest.raises(BadMessage) as refused:
            FROM_JOB.receive(receiver)
        assert str(refused.value).startswith(why), refused.value


EVENTS: list[dict[str, Any]] = [
    {"job_id": "../job0", "status": "LOG"},
    {"job_id": "job0", "status": "QUEUED"},
    {"job_id": "job0", "status": "ERROR", "description": "x" * (MAX_DESCRIPTION_CHARS + 1)},
    {"job_id": "job0", "status": "LOG", "description": "x", "pwned": True},
    {"job_id": "job0", "status": "COMPLETED", "result_size": True},
    {"job_id": "job0", "status": "ERROR", "meta": {"deep": {"a": 1}}},
]


@pytest.mark.parametrize("fields", EVENTS)
def test_an_event_is_refused_in_the_words_of_the_event_rules(channels, fields):
    sender, receiver = channels
    sender.send({"type": "event", **fields})
    with pytest.raises(BadMessage) as refused:
        FROM_JOB.receive(receiver)
    assert str(refused.value) == f"an event {event_problem(fields)}"
    # And no sender of ours can build one.
    with pytest.raises(ValueError):
        Event(**fields)


def test_a_job_process_sends_no_descriptors(channels):
    sender, receiver = channels
    with open(os.devnull) as null:
        sender.send(Ready(), [null.fileno()])
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(BadMessage, match="^file descriptors$"):
        FROM_JOB.receive(receiver)
    assert set(os.listdir("/proc/self/fd")) <= before  # closed, not kept


def test_what_is_not_json_is_refused_by_the_channel_first(channels):
    sender, receiver = channels
    sender.sock.send(b"\xff not json")
    with pytest.raises(BadMessage, match="not JSON"):
        FROM_JOB.receive(receiver)
    sender.sock.send(b"[1, 2]")
    with pytest.raises(BadMessage, match="not a JSON object"):
        FROM_JOB.receive(receiver)


def test_a_closed_peer_is_no_message(channels):
    sender, receiver = channels
    sender.sock.shutdown(socket.SHUT_WR)
    assert FROM_JOB.receive(receiver) == (None, [])


def test_what_a_ray_actor_reports_is_read_as_declared():
    event = JobEvent("job0", "COMPLETED", "done", meta={"runtime": 1.5}, result_size=4)
    items = [
        State(state="RUNNING", description="Loaded."),
        RayJobEvent(event=Event.of(event), result=b"blob"),
        RayIdle(accepting=True),
        RayIncident(incident="worker_restart"),
    ]
    for item in items:
        assert FROM_RAY_ACTOR.parse(item.model_dump()) == item
    parsed = FROM_RAY_ACTOR.parse(items[1].model_dump())
    assert isinstance(parsed, RayJobEvent) and parsed.event.job_event() == event
    with pytest.raises(BadMessage, match="unexpected message"):
        FROM_RAY_ACTOR.parse({"kind": "job"})

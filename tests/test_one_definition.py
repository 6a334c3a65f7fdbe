"""Each rule about what a job may say is defined once, and every layer uses that one.

A job's process, the parent side that watches it (`replicas.job_watch`) and
the controller's intake (`controller.intake`) once had their own copies of the final
statuses, the description limit, the field checks and the job-id rule, with
different values: these tests pin that they are now the same object, and that
what one layer lets through the next accepts.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Optional

import pytest

from nnhost.controller import intake
from nnhost.execution import events, messages
from nnhost.execution.channel import MAX_MESSAGE, BadMessage, Channel, pair
from nnhost.execution.events import (
    CUT_MARK,
    FINAL_STATUSES,
    LOG_LINE_CHARS,
    MAX_DESCRIPTION_CHARS,
    MAX_LOG_CHARS,
    MAX_META_KEYS,
    JobEvent,
    JobSpec,
    cut_description,
    event_problem,
    is_job_id,
)
from nnhost.execution.job import capture
from nnhost.execution.job import process as job_process
from nnhost.jobs.job import Job, Status
from nnhost.replicas import job_watch
from nnhost.replicas.job_watch import JobWatch, Violation, refused
from nnhost.telemetry import metrics


def test_final_statuses_are_one_set():
    assert {status.value for status in Status if status.final} == FINAL_STATUSES == {"COMPLETED", "ERROR"}
    assert [status.final for status in (Status.RUNNING, Status.LOG, Status.QUEUED)] == [False] * 3
    assert JobEvent("j", "ERROR").final and JobEvent("j", "COMPLETED").final
    assert not JobEvent("j", "RUNNING").final and not JobEvent("j", "LOG").final


def test_one_job_id_rule():
    issued = "0123456789abcdef0123456789abcdef"  # what the front issues: uuid4().hex
    assert is_job_id(issued) and is_job_id("job-1_a") and is_job_id("x" * 64)
    for bad in ("", "x" * 65, "../etc", "a b", "job\n", "é", 12345, None):
        assert not is_job_id(bad), bad
    assert intake.event_job_id(JobEvent(issued, "LOG")) == issued
    assert intake.event_job_id(JobEvent("job\n", "LOG")) is None
    assert not hasattr(intake, "_JOB_ID")


# -- the description limit and the event checks --------------------------------

SPEC = JobSpec(job_id="job0", payload_path="", compress=False)


def watched(fields: dict[str, Any]) -> object:
    """What the parent side makes of a job's message with ``fields`` (after RUNNING)."""
    watch = JobWatch(replace(SPEC, job_id=fields.get("job_id", SPEC.job_id)))
    watch.running = True
    # As the replica reads it (`replicas.slots`): parsed, then checked against its job.
    try:
        return watch.check(messages.FROM_JOB.parse({"type": "event", **fields}))
    except BadMessage as error:
        return refused(error)


def taken(fields: dict[str, Any]) -> Optional[str]:
    """What the controller's intake says of a replica's event with ``fields``."""
    job = Job(id="job0", user_id=1, model_key="k", deployment="org/model", status=Status.RUNNING)
    return intake.check_event(JobEvent(**fields), job, "org/model")


def test_the_limits_and_the_check_live_in_one_place():
    # The watcher reads a job's events with `messages.Event`, which applies the intake's check.
    assert messages.event_problem is intake.event_problem is events.event_problem
    for module, name in [
        (job_process, "MAX_DESCRIPTION"), (job_watch, "MAX_DESCRIPTION"), (job_watch, "MAX_LOG_CHARS"),
        (job_watch, "MAX_META_KEYS"), (job_watch, "FINAL"), (intake, "MAX_DESCRIPTION_CHARS"),
        (intake, "MAX_META_BYTES"), (intake, "WORKER_STATUSES"), (metrics, "FINAL"),
    ]:
        assert not hasattr(module, name), f"{module.__name__}.{name} is defined again"
    assert job_watch.LOG_LINE_CHARS is capture.LOG_LINE_CHARS is events.LOG_LINE_CHARS


def test_a_cut_description_is_what_every_layer_accepts():
    cut = cut_description("x" * (4 * MAX_DESCRIPTION_CHARS))
    assert len(cut) == MAX_DESCRIPTION_CHARS and cut.endswith(CUT_MARK)
    assert cut_description("short") == "short"
    noted = cut_description(cut, "\nIt ran out of memory.")  # the parent side's note
    assert len(noted) == MAX_DESCRIPTION_CHARS and noted.endswith(CUT_MARK + "\nIt ran out of memory.")
    fields = {"job_id": "job0", "status": "ERROR", "description": noted}
    assert isinstance(watched(fields), JobEvent) and taken(fields) is None
    over = {**fields, "description": noted + "x"}
    assert isinstance(watched(over), Violation) and taken(over) is not None


def test_an_over_long_final_description_is_cut_by_the_job_and_accepted_downstream():
    import torch

    sent: list[dict[str, Any]] = []

    class Channel:
        def send(self, message: messages.Message) -> None:
            sent.append(message.model_dump())  # what the channel writes

    class Runner:
        def run(self, spec: JobSpec, emit: Any) -> bool:
            emit(JobEvent(spec.job_id, "RUNNING", "Running."))
            torch.set_grad_enabled(not torch.is_grad_enabled())  # a change the final message notes
            emit(JobEvent(spec.job_id, "ERROR", "Traceback\n" * MAX_DESCRIPTION_CHARS, meta={"runtime": 1.0}))
            return True

    grad = torch.is_grad_enabled()
    try:
        job_process.run_one(SPEC, Runner(), Channel())  # type: ignore[arg-type]
    finally:
        torch.set_grad_enabled(grad)
    final = sent[-1]
    assert final["status"] == "ERROR" and len(final["description"]) <= MAX_DESCRIPTION_CHARS
    assert CUT_MARK in final["description"] and final["description"].endswith("starts without it.")
    watch = JobWatch(SPEC)
    checked = [watch.check(messages.FROM_JOB.parse(message)) for message in sent]
    assert all(isinstance(event, JobEvent) for event in checked), checked
    job = Job(id="job0", user_id=1, model_key="k", deployment="org/model", status=Status.RUNNING)
    assert intake.check_event(checked[-1], job, "org/model") is None


def test_an_over_long_log_line_is_cut_by_either_capture_and_accepted_downstream():
    lines: list[str] = []
    emitter = capture.LineEmitter(lines.append, max_lines=10)
    emitter.write("y" * (10 * LOG_LINE_CHARS) + "\n")
    piped = job_watch.LogLines(max_lines=10).feed(b"z" * (10 * LOG_LINE_CHARS) + b"\n")
    for line in [*lines, *piped]:
        assert LOG_LINE_CHARS < len(line) <= MAX_LOG_CHARS
        fields = {"job_id": "job0", "status": "LOG", "description": line}
        assert isinstance(watched(fields), JobEvent) and taken(fields) is None
    over = {"job_id": "job0", "status": "LOG", "description": "y" * (MAX_LOG_CHARS + 1)}
    assert isinstance(watched(over), Violation) and taken(over) is not None


GOOD = {"job_id": "job0", "status": "ERROR", "description": "it failed", "meta": {"runtime": 0.5}}
BAD_FIELDS = [
    ("a job id no server issues", {"job_id": "../job0"}),
    ("a job id over 64 characters", {"job_id": "j" * 65}),
    ("a status a job never sends", {"status": "QUEUED"}),
    ("no such status", {"status": "PWNED"}),
    ("a description that is not text", {"description": b"bytes"}),
    ("meta that is not a table", {"meta": ["runtime"]}),
    ("meta that is nested", {"meta": {"runtime": 1, "deep": {"a": 1}}}),
    ("meta that JSON cannot hold", {"meta": {"runtime": float("nan")}}),
    ("meta with too many keys", {"meta": {f"k{n}": n for n in range(MAX_META_KEYS + 1)}}),
    ("meta with a long key", {"meta": {"k" * 65: 1}}),
    ("meta with long text", {"meta": {"note": "x" * 257}}),
    ("a runtime that is not a duration", {"meta": {"runtime": -1.0}}),
    ("a result size that is not a size", {"result_size": -1}),
    ("a result size that is a bool", {"result_size": True}),
]


def test_the_watcher_and_the_intake_accept_the_same_fields():
    assert isinstance(watched(GOOD), JobEvent) and taken(GOOD) is None


@pytest.mark.parametrize("what, change", BAD_FIELDS, ids=[what for what, _ in BAD_FIELDS])
def test_the_watcher_and_the_intake_refuse_the_same_fields(what, change):
    fields = {**GOOD, **change}
    problem = event_problem(fields)
    assert problem is not None, what
    refused = watched(fields)
    assert isinstance(refused, Violation) and problem in refused, (what, refused)
    assert problem in (taken(fields) or ""), what


def test_the_longest_description_fits_the_channel_in_any_script():
    """The channel is a layer too: the cut description of any text travels in one packet."""
    left, right = pair()
    sender, receiver = Channel(left), Channel(right)
    notice = " Your request changed state shared by its process (torch grad mode)." * 3
    meta = {f"key{n}": 1.0e300 for n in range(MAX_META_KEYS)}
    try:
        for text in ("x", "é", "\u4e2d", "\U0001f600", "\ud800", "\x00"):
            description = cut_description(text * (2 * MAX_DESCRIPTION_CHARS), notice)
            event = JobEvent("j" * 64, "ERROR", description, meta=meta, result_size=2**62)
            sender.send({"type": "event", **event.to_dict()})
            message, fds = receiver.recv()
            assert message is not None and not fds
            assert message["description"] == description and event_problem(
                {key: value for key, value in message.items() if key != "type"}
            ) is None
            assert len(json.dumps(message, separators=(",", ":")).encode()) <= MAX_MESSAGE
    finally:
        left.close()
        right.close()

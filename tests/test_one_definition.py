"""Each rule about what a job may say is defined once, and every layer uses that one.

A job's process, the parent side that watches it (`deployments.job_watch`) and
the controller's intake (`jobs.intake`) once had their own copies of the final
statuses, the description limit, the field checks and the job-id rule, with
different values: these tests pin that they are now the same object, and that
what one layer lets through the next accepts.
"""

from __future__ import annotations

from nnhost.execution.events import FINAL_STATUSES, JobEvent, is_job_id
from nnhost.jobs import intake
from nnhost.jobs.job import Status


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

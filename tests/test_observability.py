"""What an operator sees: Prometheus metrics, JSON log lines, request ids.

One server of this module's own (fresh counters, ``--log-format json``) runs a
batch of real nnsight requests, some completing, some failing in the
user's code, one killed past its time limit. `/metrics` is scraped before and after with Prometheus's own
parser, and every counter must have moved by exactly the number of jobs of its
kind. The log file must hold one JSON line per status of a job, with its id,
and every HTTP response an ``x-request-id``, echoed when the caller sent one.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from conftest import API_KEY, TEST_REPO
from prometheus_client.parser import text_string_to_metric_families
from test_accounts import as_client, wait_done

from nnhost.testing import ServerProcess

PROMPT = "The Eiffel Tower is in the city of"
GOOD, BAD = 3, 2


@pytest.fixture(scope="module")
def observed(root, server_hf_home, test_snapshot, server):
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / "observed-data",
        hf_home=server_hf_home,
        api_key=API_KEY,
        extra_args=["--log-format", "json", "--log-level", "info",
                    "--time-limit", "3", "--kill-grace", "1"],
    )
    process.start()
    yield process
    process.stop()


def scrape(server) -> dict:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    response = httpx.get(f"{server.url}/metrics", headers={"ndif-api-key": API_KEY}, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def moved(before: dict, after: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def good_trace(model):
    with model.trace(PROMPT, remote=True):
        logits = model.lm_head.output.save()
    return logits


def bad_trace(model):
    with model.trace(PROMPT, remote=True):
        hidden = model.transformer.h[0].output[0]
        hidden[0, 10_000].save()  # past the end: an IndexError in the user's own code


def stubborn_trace(model):
    with model.trace(PROMPT, remote=True):
        while True:
            try:
                while True:
                    pass
            except BaseException:
                pass  # swallows the time limit's interrupt: the server must kill it


def submit(model) -> str:
    with model.trace(PROMPT, remote=True, blocking=False) as tracer:
        model.lm_head.output.save()
    return tracer.backend.job_id


def test_counters_move_by_exactly_the_jobs_of_their_kind(observed, remote_model):
    model = TEST_REPO
    before = scrape(observed)
    assert value(before, "nnhost_deployment_level", model=model, level="HOT") == 1
    assert value(before, "nnhost_queue_length", model=model) == 0
    with as_client(observed, API_KEY):
        for _ in range(GOOD):
            assert good_trace(remote_model).shape[0] == 1
        for _ in range(BAD):
            with pytest.raises(Exception):
                bad_trace(remote_model)
        with pytest.raises(Exception, match="did not stop when interrupted"):
            stubborn_trace(remote_model)
    after = scrape(observed)

    # (A memory bomb is not in the batch: whether the kernel's cgroup kills it, which the
    # server counts, or RLIMIT_AS makes it a MemoryError in the user's code, depends on the host.)
    killed = {"time_limit_kill": 1, "out_of_memory": 0, "protocol_violation": 0, "job_process_died": 0}
    total = GOOD + BAD + sum(killed.values())
    assert moved(before, after, "nnhost_jobs_received_total", model=model) == total
    assert moved(before, after, "nnhost_jobs_finished_total", model=model, status="COMPLETED") == GOOD
    assert moved(before, after, "nnhost_jobs_finished_total", model=model, status="ERROR") == (
        total - GOOD
    )
    assert moved(before, after, "nnhost_queue_wait_seconds_count", model=model) == total
    assert moved(before, after, "nnhost_job_run_seconds_count", model=model) == total
    assert moved(before, after, "nnhost_job_run_seconds_sum", model=model) > 0
    assert moved(before, after, "nnhost_result_bytes_count", model=model) == GOOD
    assert moved(before, after, "nnhost_result_bytes_sum", model=model) > GOOD * 1000
    assert moved(
        before, after, "nnhost_http_responses_total", method="POST", route="/request", code="200"
    ) == total
    # Containment stopped exactly the job it had to; the model's worker never died.
    assert ("nnhost_worker_restarts_total", (("model", model),)) in after
    assert moved(before, after, "nnhost_worker_restarts_total", model=model) == 0
    for kind, count in killed.items():
        assert ("nnhost_containment_faults_total", (("kind", kind), ("model", model))) in after
        assert moved(before, after, "nnhost_containment_faults_total", model=model, kind=kind) == count
    assert value(after, "nnhost_queue_length", model=model) == 0
    assert value(after, "nnhost_jobs_running", model=model) == 0
    assert value(after, "nnhost_replicas", model=model, state="RUNNING") == 1
    assert value(after, "nnhost_device_memory_bytes", device="cpu", kind="budget") > 0
    assert value(after, "nnhost_device_memory_bytes", device="cpu", kind="used") > 0


def log_lines(server) -> list[dict]:
    lines = []
    for raw in server.log_path.read_text(errors="replace").splitlines():
        if raw.startswith("{"):
            lines.append(json.loads(raw))  # every log record is JSON; prints are not records
    return lines


def test_json_log_lines_of_one_job(observed, remote_model):
    with as_client(observed, API_KEY):
        job_id = submit(remote_model)
    assert wait_done(observed, API_KEY, job_id)["status"] == "COMPLETED"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        mine = [line for line in log_lines(observed) if line.get("job_id") == job_id]
        if mine and mine[-1]["status"] == "COMPLETED":
            break
        time.sleep(0.1)
    statuses = [line["status"] for line in mine]
    assert statuses == ["RECEIVED", "QUEUED", "DISPATCHED", "RUNNING", "COMPLETED"], statuses
    for line in mine:
        assert {"time", "level", "logger", "message"} <= set(line)
        assert line["model"] == TEST_REPO and job_id in line["message"]
    # Accepting the job happened inside its POST: those lines carry that request's id,
    # and so does uvicorn's access line for the POST.
    accepted = mine[0]["request_id"]
    assert mine[1]["request_id"] == accepted
    access = [
        line for line in log_lines(observed)
        if line["logger"] == "uvicorn.access" and line.get("request_id") == accepted
    ]
    assert len(access) == 1 and "POST /request" in access[0]["message"]
    # What the worker reported later was not part of any HTTP request.
    assert "request_id" not in mine[-1]


def test_every_response_has_a_request_id(observed):
    fresh = httpx.get(f"{observed.url}/status")
    other = httpx.get(f"{observed.url}/status")
    assert len(fresh.headers["x-request-id"]) == 32
    assert fresh.headers["x-request-id"] != other.headers["x-request-id"]
    echoed = httpx.get(f"{observed.url}/ping", headers={"x-request-id": "trace-abc.123"})
    assert echoed.headers["x-request-id"] == "trace-abc.123"
    # Refusals carry one too, and an id that is not sane is replaced, never echoed.
    refused = httpx.get(f"{observed.url}/response/nope", headers={"x-request-id": "x" * 500})
    assert refused.status_code in (401, 404)
    assert refused.headers["x-request-id"] != "x" * 500
    assert len(refused.headers["x-request-id"]) == 32
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = [line for line in log_lines(observed) if line.get("request_id") == "trace-abc.123"]
        if seen:
            break
        time.sleep(0.1)
    assert seen and "GET /ping" in seen[0]["message"]

"""Separate API and controller processes, as a cluster runs them, on loopback.

Two ``--role api`` processes and a ``--role controller`` share one PostgreSQL,
one Redis and one result store (a shared directory, then moto's S3 server),
all started by the suite. A load balancer
of the test's own sends the client's websocket to one API process and its HTTP
requests to the other: the unmodified nnsight client still gets every update
and a result equal to a local run, for every program of `parity_programs`
(sessions, generation, gradients, code shipped by value). Then the controller is killed with SIGKILL:
a standby controller takes over, the jobs that were queued run (once), and the
one that was running ends with an ERROR saying it may have run.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest
from balancer import Balancer, websockets_to_first
from compare import assert_identical
from conftest import API_KEY, TEST_REPO
from moto_s3 import CREDENTIALS, S3Endpoint
from parity_programs import PROGRAMS
from service_redis import redis_server  # noqa: F401  (the fixture)
from sqlalchemy import create_engine, text
from test_accounts import as_client

from nnhost.testing import ServerProcess

PROMPT = "The Eiffel Tower is in the city of"
HEADERS = {"ndif-api-key": API_KEY}


@pytest.fixture(scope="module", params=["directory", "s3"])
def cluster(request, root, server_hf_home, test_snapshot, server, postgres, redis_server):  # noqa: F811
    database = postgres.new_database()
    store, env, endpoint = ["--results", str(root / "roles-shared-results")], {}, None
    if request.param == "s3":
        endpoint = S3Endpoint().start()
        endpoint.bucket("roles")
        store = ["--results", "s3://roles/runs", "--results-endpoint", endpoint.url]
        env = dict(CREDENTIALS)
    started = []

    def start(name, role, *extra):
        process = ServerProcess(
            [TEST_REPO], data_dir=root / f"roles-{request.param}-{name}", hf_home=server_hf_home,
            api_key=API_KEY, env=env,
            # One job at a time: the jobs behind a running one wait in the queue,
            # which is what a controller hands over.
            extra_args=["--role", role, "--database", database, "--events", redis_server.url,
                        "--jobs-at-once", "1", *store, *extra],
        )
        started.append(process)
        return process.start()

    parts = {"database": database, "start": start, "started": started}
    parts["controller"] = start("controller-a", "controller")
    parts["apis"] = [start("api-1", "api"), start("api-2", "api")]
    balancer = Balancer([api.port for api in parts["apis"]], websockets_to_first)
    parts["balancer"] = balancer
    yield parts
    balancer.stop()
    for process in reversed(started):
        process.stop()
    if endpoint is not None:
        endpoint.stop()


def test_api_processes_share_the_work_with_results_equal_to_local(cluster, remote_model, local_model):
    balancer = cluster["balancer"]
    with as_client(balancer, API_KEY):
        with remote_model.trace(PROMPT, remote=True):
            remote = remote_model.lm_head.output.save()
            print("through two API processes")
    with local_model.trace(PROMPT):
        local = local_model.lm_head.output.save()
    assert_identical(remote, local)
    # The websocket went to one API process, the request (and the download) to the other.
    assert balancer.sent[0], balancer.sent
    assert any("POST /request" in line for line in balancer.sent[1]), balancer.sent

    # Any API process answers for any job, and serves its result.
    api_1, api_2 = cluster["apis"]
    listed = httpx.get(f"{api_1.url}/admin/jobs", headers=HEADERS, timeout=10).json()["jobs"]
    job_id = next(job["id"] for job in listed if job["status"] == "COMPLETED")
    for api in (api_1, api_2):
        answer = httpx.get(f"{api.url}/response/{job_id}", headers=HEADERS, timeout=10).json()
        assert answer["status"] == "COMPLETED"
        download = httpx.get(answer["data"], timeout=30)
        assert download.status_code == 200 and len(download.content) > 0

    # The controller's board reaches every API process: /status, and /metrics' state.
    for api in (api_1, api_2):
        status = httpx.get(f"{api.url}/status", timeout=10).json()
        assert any(d["application_state"] == "RUNNING" for d in status["deployments"].values())
        metrics = httpx.get(f"{api.url}/metrics", headers={"ndif-api-key": API_KEY}, timeout=10).text
        assert 'nnhost_deployment_level{level="HOT"' in metrics
    # The controller serves no requests of its own.
    refused = httpx.post(f"{cluster['controller'].url}/request", headers=HEADERS, timeout=10)
    assert refused.status_code == 404


@pytest.mark.parametrize("name,program", PROGRAMS, ids=[name for name, _ in PROGRAMS])
def test_every_parity_program_runs_through_the_split_cluster(
    name, program, cluster, remote_model, local_model
):
    assert_identical(program(remote_model, cluster["balancer"].url), program(local_model, False))


def _submit(model, api, seconds: float, tag: str):
    """A non-blocking job that prints ``tag`` and then sleeps; its backend, to poll."""
    with as_client(api, API_KEY):
        with model.trace(PROMPT, remote=True, blocking=False) as tracer:
            print(tag)
            time.sleep(seconds)
            logits = model.lm_head.output.save()  # noqa: F841
    return tracer.backend


def _poll(backend, api, until: float):
    with as_client(api, API_KEY):
        result = None
        while result is None and time.monotonic() < until:
            try:
                result = backend()
            except Exception as error:  # an ERROR status is raised by the client
                return ("ERROR", str(error))
            time.sleep(0.2)
        return ("COMPLETED", result) if result is not None else (backend.status, None)


def _wait_running(api, job_id: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = httpx.get(f"{api.url}/response/{job_id}", headers=HEADERS, timeout=10)
        if answer.json()["status"] == "RUNNING":
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never ran: {answer.text}")


def _each_printed_once(cluster, backends) -> None:
    """None ran twice: each job's one print() is in the database exactly once."""
    engine = create_engine(cluster["database"])
    try:
        with engine.connect() as db:
            for backend in backends:
                lines = db.execute(text("SELECT line FROM job_logs WHERE job_id = :id"),
                                   {"id": backend.job_id}).scalars().all()
                assert len(lines) == 1, (backend.job_id, lines)
    finally:
        engine.dispose()


def test_a_standby_controller_takes_over_a_killed_one_and_runs_each_job_once(
    cluster, remote_model, local_model
):
    api_1, api_2 = cluster["apis"]
    standby = cluster["start"]("controller-b", "controller")
    holder = httpx.get(f"{api_1.url}/status", timeout=10).json()
    assert "controller" not in holder  # the acting controller reports

    running = _submit(remote_model, api_1, 20.0, "the long one")
    _wait_running(api_2, running.job_id)
    queued = [_submit(remote_model, (api_1, api_2)[i % 2], 0.0, f"queued {i}") for i in range(3)]

    cluster["controller"].stop(signal.SIGKILL)
    killed = time.monotonic()
    finished = {}
    until = time.monotonic() + 120
    for backend in [running, *queued]:
        finished[backend.job_id] = _poll(backend, api_2, until)
    took_over = time.monotonic() - killed
    print(f"standby took over and ran the queued jobs {took_over:.1f}s after the SIGKILL")

    status, said = finished[running.job_id]
    assert status == "ERROR" and "restarted while your request was running" in said
    with local_model.trace(PROMPT):
        local = local_model.lm_head.output.save()
    for backend in queued:
        status, result = finished[backend.job_id]
        assert status == "COMPLETED", (status, result, standby.log_tail())
        assert_identical(result["logits"], local)
    _each_printed_once(cluster, [running, *queued])


def test_a_controller_stopped_gracefully_finishes_its_job_and_hands_the_queue_over(
    cluster, remote_model, local_model
):
    api_1, api_2 = cluster["apis"]
    # The standby of the test before is the controller now; one more stands by.
    cluster["start"]("controller-c", "controller")
    acting = cluster["started"][-2]
    running = _submit(remote_model, api_1, 3.0, "finishes on the old one")
    _wait_running(api_1, running.job_id)
    queued = [_submit(remote_model, api_2, 0.0, f"after the handover {i}") for i in range(2)]
    stopped = time.monotonic()
    acting.stop(signal.SIGTERM, timeout=60)
    print(f"the old controller stopped {time.monotonic() - stopped:.1f}s after SIGTERM")
    until = time.monotonic() + 120
    finished = {backend.job_id: _poll(backend, api_1, until) for backend in [running, *queued]}
    with local_model.trace(PROMPT):
        local = local_model.lm_head.output.save()
    for backend in [running, *queued]:
        status, result = finished[backend.job_id]
        assert status == "COMPLETED", (status, result)
        assert_identical(result["logits"], local)
    _each_printed_once(cluster, [running, *queued])


def test_a_split_role_without_a_shared_bus_is_refused_saying_why(root, server_hf_home, test_snapshot):
    import os
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "serve", TEST_REPO, "--role", "api",
         "--data-dir", str(root / "roles-no-bus")],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "HF_HOME": str(server_hf_home), "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 2
    assert "--role api needs --events redis://" in run.stderr

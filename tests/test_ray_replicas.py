"""Replicas on a real Ray cluster: jobs run where Ray placed them, and survive losing a node.

A server started with ``--cluster HOST:PORT`` runs its model's replica as a
Ray actor on one of two worker nodes; the unmodified nnsight client gets the
same results as a local run. Removing the node that holds the replica in the
middle of a job ends that job with an ERROR that says so; the replica comes
back on the surviving node, and the next job succeeds.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest

from compare import assert_identical
from conftest import API_KEY, TEST_REPO
from nnhost.testing import ServerProcess
from service_ray import ray_cluster  # noqa: F401  (the fixture)
from test_accounts import as_client

PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture(scope="module")
def ray_server(root, server_hf_home, test_snapshot, server, ray_cluster):  # noqa: F811
    process = ServerProcess(
        [TEST_REPO], data_dir=root / "ray-data", hf_home=server_hf_home, api_key=API_KEY,
        extra_args=["--cluster", ray_cluster.address, "--time-limit", "60"],
    )
    process.start(timeout=300)
    yield process
    process.stop()


def trace(model):
    with model.trace(PROMPT, remote=True):
        hidden = model.transformer.h[0].output[0].save()
        logits = model.lm_head.output.save()
    return hidden, logits


def replica_node(server) -> str:
    entry = server.status()["deployments"][TEST_REPO]
    assert entry["application_state"] == "RUNNING", entry
    found = re.search(r"On Ray node ([0-9a-f]+)", entry["description"])
    assert found, entry
    return found.group(1)


def wait_running(server, timeout=300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry = server.status()["deployments"][TEST_REPO]
        if entry["application_state"] == "RUNNING":
            return entry
        time.sleep(0.2)
    raise AssertionError(f"the replica did not come back: {entry}")


def test_jobs_run_on_a_ray_node_with_local_results(ray_server, ray_cluster, remote_model, local_model):  # noqa: F811
    node = replica_node(ray_server)
    assert node in {worker.node_id for worker in ray_cluster.workers}
    with as_client(ray_server, API_KEY):
        remote = [trace(remote_model) for _ in range(2)]
    with local_model.trace(PROMPT):
        hidden = local_model.transformer.h[0].output[0].save()
        logits = local_model.lm_head.output.save()
    for got in remote:
        assert_identical(got, (hidden, logits))


def test_losing_the_node_fails_its_job_and_the_replica_moves(ray_server, ray_cluster, remote_model, local_model):  # noqa: F811
    node = replica_node(ray_server)
    with as_client(ray_server, API_KEY):
        with remote_model.trace(PROMPT, remote=True, blocking=False) as tracer:
            time.sleep(30)
            remote_model.lm_head.output.save()
    job_id = tracer.backend.job_id
    headers = {"ndif-api-key": API_KEY}
    deadline = time.monotonic() + 60
    while httpx.get(f"{ray_server.url}/response/{job_id}", headers=headers).json()["status"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    ray_cluster.remove(ray_cluster.node(node))
    deadline = time.monotonic() + 120
    while True:
        final = httpx.get(f"{ray_server.url}/response/{job_id}", headers=headers).json()
        if final["status"] in ("COMPLETED", "ERROR"):
            break
        assert time.monotonic() < deadline, final
        time.sleep(0.2)
    assert final["status"] == "ERROR" and "machine running your request was lost" in final["description"]

    wait_running(ray_server)
    moved = replica_node(ray_server)
    assert moved != node and moved == ray_cluster.workers[0].node_id
    with as_client(ray_server, API_KEY):
        hidden, logits = trace(remote_model)
    with local_model.trace(PROMPT):
        expected = local_model.lm_head.output.save()
    assert_identical(logits, expected)
    metrics = httpx.get(f"{ray_server.url}/metrics").text
    assert f'nnhost_worker_restarts_total{{model="{TEST_REPO}"}} 1.0' in metrics

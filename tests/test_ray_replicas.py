"""Replicas on a real Ray cluster: jobs run where Ray placed them, and survive losing a node.

A server started with ``--cluster HOST:PORT`` runs its model's replica as a
Ray actor on one of two worker nodes; the unmodified nnsight client gets the
same results as a local run, and a client of another nnsight version is
served by its runtime on that node. Removing the node that holds the replica in the
middle of a job ends that job with an ERROR that says so; the replica comes
back on the surviving node, and the next job succeeds. /status reports each
node's memory and what replicas hold there, and a model that no single node
can hold is refused, however much the nodes have together.
"""

from __future__ import annotations

import re
import signal
import time

import httpx
import pytest
from compare import assert_identical
from conftest import API_KEY, TEST_REPO
from service_ray import ray_cluster  # noqa: F401  (the fixture)
from service_redis import redis_server  # noqa: F401  (the fixture)
from test_accounts import as_client

from nnhost.models.sizing import tensor_bytes
from nnhost.testing import ServerProcess

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


def test_a_per_request_adapter_travels_to_the_ray_node(
    ray_server, server_hf_home, test_snapshot, remote_model, local_model
):
    """The node has no copy of the server's cache: the adapter's files go with the job."""
    from compare import assert_same
    from test_adapters import ADAPTER, _open, adapted_program, base_program

    from nnhost.models.tiny_lora import build_tiny_lora

    snapshot = build_tiny_lora(ADAPTER, test_snapshot, TEST_REPO, server_hf_home)
    adapted_remote = _open(TEST_REPO, peft=ADAPTER)
    adapted_local = _open(str(test_snapshot), peft=str(snapshot), dispatch=True)
    with as_client(ray_server, API_KEY):
        adapted = adapted_program(adapted_remote, True)
        base = base_program(remote_model, True)
    assert_same(adapted, adapted_program(adapted_local, False))
    assert_same(base, base_program(local_model, False))


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


def test_a_client_of_another_version_is_served_by_its_runtime_on_the_ray_node(ray_server, test_snapshot):
    """The replica's actor starts the runtime's template on its node, beside the host it holds."""
    from test_runtimes import job_nnsight, runtime_versions

    version = runtime_versions()[0]
    job, client, equal = job_nnsight(ray_server, version, test_snapshot)
    assert (job, client, equal) == (version, version, True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = [entry.get("runtimes") or {} for entry in ray_server.status()["deployments"].values()]
        if any(runtimes.get(version) for runtimes in held):
            break
        time.sleep(0.5)
    assert any(runtimes.get(version) for runtimes in held), held


def test_an_api_process_and_a_controller_on_ray_serve_the_client(
    root, server_hf_home, ray_cluster, postgres, redis_server,  # noqa: F811
    remote_model, local_model, ray_server,
):
    """The whole cluster mode at once: replicas on Ray, API and controller apart, PostgreSQL, Redis.

    Before a node is lost below: each worker node has room for one replica, and
    the other server's holds one of them."""
    database = postgres.new_database()
    shared = ["--database", database, "--events", redis_server.url,
              "--results", str(root / "ray-roles-results"), "--time-limit", "60"]
    controller = ServerProcess(
        [TEST_REPO], data_dir=root / "ray-roles-controller", hf_home=server_hf_home,
        api_key=API_KEY, extra_args=["--role", "controller", "--cluster", ray_cluster.address, *shared],
    )
    api = ServerProcess(
        [TEST_REPO], data_dir=root / "ray-roles-api", hf_home=server_hf_home, api_key=API_KEY,
        extra_args=["--role", "api", *shared],
    )
    try:
        controller.start(timeout=300)
        api.start(timeout=120)
        assert re.search(r"On Ray node [0-9a-f]+", api.status()["deployments"][TEST_REPO]["description"])
        with as_client(api, API_KEY):
            hidden, logits = trace(remote_model)
        with local_model.trace(PROMPT):
            expected = local_model.lm_head.output.save()
        assert_identical(logits, expected)
        # SIGTERM to the controller alone (as systemd sends it) stops it as it does
        # without Ray: its own handler runs, it gives up the lease and exits 0.
        controller.process.send_signal(signal.SIGTERM)
        assert controller.process.wait(timeout=90) == 0, controller.log_tail()
        assert "SystemExit" not in controller.log_path.read_text(errors="replace")
        assert holders_of_the_controller_lease(database) == []
    finally:
        api.stop()
        controller.stop()


def holders_of_the_controller_lease(database_url: str) -> list:
    import psycopg

    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://")) as db:
        return db.execute("SELECT holder FROM leases WHERE name = 'controller'").fetchall()


class Answering(ServerProcess):
    """A server that is up once /status answers (its model may rightly stay COLD)."""

    def wait_running(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_tail()
            try:
                if self.status()["deployments"]:
                    return
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.2)
        raise TimeoutError(self.log_tail())


def test_memory_is_budgeted_per_node_and_a_model_no_node_can_hold_is_refused(
        ray_server, ray_cluster, root, server_hf_home, test_snapshot):  # noqa: F811
    status = ray_server.status()
    workers = [worker.node_id for worker in ray_cluster.workers]
    nodes = status["nodes"]
    assert set(workers) <= set(nodes)
    held, size = replica_node(ray_server), status["deployments"][TEST_REPO]["size_bytes"]
    other = next(node for node in workers if node != held)
    assert nodes[held]["replicas"] == [TEST_REPO] and nodes[held]["used_bytes"] == size
    assert nodes[other]["replicas"] == [] and nodes[other]["used_bytes"] == 0
    assert status["devices"]["cpu"]["budget_bytes"] == sum(n["budget_bytes"] for n in nodes.values())

    # A second server on the same cluster, its model sized past every node but not their sum.
    room = sorted(nodes[node]["budget_bytes"] for node in workers)
    tensors = sum(tensor_bytes(test_snapshot).values())
    margin = (room[-1] + room[0] // 2) / tensors - 1
    assert room[-1] < tensors * (1 + margin) < sum(room)
    big = Answering([TEST_REPO], data_dir=root / "ray-big", hf_home=server_hf_home, api_key=API_KEY,
                    extra_args=["--cluster", ray_cluster.address],
                    env={"NNHOST_MEMORY_MARGIN": repr(margin)})
    with big:
        entry = big.status()["deployments"][TEST_REPO]
        assert entry["deployment_level"] == "COLD" and "Left COLD at start" in entry["note"]
        assert "on one Ray node" in entry["note"] and "no node has that: the largest" in entry["note"]
        assert any(node[:12] in entry["note"] for node in workers), entry["note"]
        refused = httpx.post(f"{big.url}/admin/deploy", json={"model": TEST_REPO, "level": "hot"},
                             headers={"ndif-api-key": API_KEY}, timeout=30)
        assert refused.status_code == 409 and "on one Ray node" in refused.json()["detail"]
        assert set(workers) <= set(big.status()["nodes"])


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
    metrics = httpx.get(f"{ray_server.url}/metrics", headers={"ndif-api-key": API_KEY}).text
    assert f'nnhost_worker_restarts_total{{model="{TEST_REPO}"}} 1.0' in metrics


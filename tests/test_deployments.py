"""Many models in a memory budget, hotswapping, fair queues, cancels, and failures.

One server here holds two small models with a memory budget that fits only one
of them, so every switch between them evicts the other. Results are compared
with the same programs run locally.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import warnings

import httpx
import pytest
from compare import assert_same
from conftest import API_KEY, sleeping_payload

from nnhost.testing import ServerProcess, free_port

MODEL_A = "nnhost-test/swap-a"
MODEL_B = "nnhost-test/swap-b"
PROMPT = "The Eiffel Tower is in the city of"
#: Jobs the swap server's replica runs at once: its tests keep that many busy
#: to make the others wait in the queue.
AT_ONCE = 2


@pytest.fixture(scope="module")
def swap_home(root):
    from nnhost.models.tiny import TinyGPT2Spec, build_tiny_gpt2

    home = root / "swap-hf"
    snapshots = {
        MODEL_A: build_tiny_gpt2(MODEL_A, hf_home=home, spec=TinyGPT2Spec(seed=1)),
        MODEL_B: build_tiny_gpt2(MODEL_B, hf_home=home, spec=TinyGPT2Spec(seed=2)),
    }
    return home, snapshots


@pytest.fixture(scope="module")
def swap_server(root, swap_home):
    home, _ = swap_home
    data = root / "swap-data"
    data.mkdir(parents=True, exist_ok=True)
    # The fairness test queues hundreds of jobs at once: no per-user limits here.
    (data / "nnhost.toml").write_text(
        "[limits.default]\nrequests_per_minute = 0\nqueued_jobs = 0\n"
    )
    # Each model needs ~0.7 MB with the margin: 1 MB fits one, not both.
    process = ServerProcess(
        [MODEL_A, MODEL_B],
        data_dir=data,
        hf_home=home,
        api_key=API_KEY,
        extra_args=["--memory-budget", "cpu=1MB", "--time-limit", "20", "--jobs-at-once", str(AT_ONCE)],
    )
    process.start()
    yield process
    process.stop()


def levels(server) -> dict:
    return {
        entry["deployment"]: entry["deployment_level"]
        for entry in server.status()["deployments"].values()
    }


def headers(key=API_KEY):
    return {"ndif-api-key": key, "nnsight-version": "0.8.1"}


def local_model(snapshot):
    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LanguageModel(str(snapshot), dispatch=True)


def last_logits(model, remote, host=None):
    with model.trace(PROMPT, remote=host if remote and host else remote):
        logits = model.lm_head.output[:, -1].save()
    return {"logits": logits}


def statuses_of(model, host):
    """Run a trace through the async backend; every raw update and the saves."""
    from nnsight.intervention.backends.remote import AsyncRemoteBackend

    backend = AsyncRemoteBackend(model.to_model_key(), host=host)
    with model.trace(PROMPT, backend=backend):
        logits = model.lm_head.output[:, -1].save()

    async def consume():
        return [update async for update in backend]

    return asyncio.run(consume())


def test_two_models_in_a_budget_for_one_swap_on_demand(swap_server, swap_home):
    _, snapshots = swap_home
    assert levels(swap_server) == {MODEL_A: "HOT", MODEL_B: "COLD"}
    # The conftest mirror points at the session server; these models live here.
    from nnsight.modeling import huggingface

    for repo in (MODEL_A, MODEL_B):
        huggingface._ID_CACHE[repo] = repo
    models = {repo: local_model(snapshots[repo]) for repo in (MODEL_A, MODEL_B)}
    # Clients built from the same files, whose keys name the hosted repo ids.
    clients = {repo: local_model(snapshots[repo]) for repo in (MODEL_A, MODEL_B)}
    for repo, client in clients.items():
        client.repo_id = repo

    sequence = [MODEL_B, MODEL_A, MODEL_B, MODEL_A]
    seen_levels = []
    for repo in sequence:
        updates = statuses_of(clients[repo], swap_server.url)
        result = updates[-1]
        statuses = [u.status.value for u in updates[:-1]]
        assert statuses[-1] == "COMPLETED", updates[-2]
        assert_same(result, last_logits(models[repo], False))
        other = MODEL_A if repo == MODEL_B else MODEL_B
        assert statuses.index("PROVISIONING") < statuses.index("DEPLOYING") < statuses.index("RUNNING")
        deploying = [u.description for u in updates[:-1] if u.status.value == "DEPLOYING"]
        assert deploying and f"Deploying {repo}" in deploying[0], statuses
        assert f"evicted {other}" in deploying[0]
        seen_levels.append(levels(swap_server))
    assert seen_levels == [
        {MODEL_A: "COLD", MODEL_B: "HOT"},
        {MODEL_A: "HOT", MODEL_B: "COLD"},
        {MODEL_A: "COLD", MODEL_B: "HOT"},
        {MODEL_A: "HOT", MODEL_B: "COLD"},
    ]


def test_operator_commands(swap_server):
    def nnhost(*args):
        return subprocess.run(
            [sys.executable, "-m", "nnhost.cli", *args, "--url", swap_server.url, "--api-key", API_KEY],
            capture_output=True, text=True, timeout=60,
        )

    status = nnhost("status")
    assert status.returncode == 0 and MODEL_A in status.stdout and "cpu:" in status.stdout
    evicted = nnhost("evict", MODEL_A)
    assert evicted.returncode == 0, evicted.stderr
    assert levels(swap_server)[MODEL_A] == "COLD"
    deployed = nnhost("deploy", MODEL_B, "--level", "warm")
    assert deployed.returncode == 0, deployed.stderr
    deadline = time.monotonic() + 60
    while levels(swap_server)[MODEL_B] != "WARM" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert levels(swap_server)[MODEL_B] == "WARM"
    missing = nnhost("deploy", "nobody/nothing")
    assert missing.returncode != 0 and "not" in missing.stderr.lower()
    jobs = nnhost("jobs", "--model", MODEL_A, "--json")
    assert jobs.returncode == 0 and all(j["model"] == MODEL_A for j in json.loads(jobs.stdout))
    refused = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "evict", MODEL_B, "--url", swap_server.url,
         "--api-key", "nnh_wrong"], capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode != 0 and "403" in refused.stderr


def _payload(model, sleep: float) -> bytes:
    return sleeping_payload(model, PROMPT, sleep)


#: One connection pool for the many submissions (a new httpx client per call
#: costs more than the server takes to accept a job).
_HTTP = httpx.Client()


def _submit(server, key, repo, blob) -> str:
    key_json = json.dumps({"repo_id": repo, "revision": None, "task": "text-generation"})
    data = {"model_key": f"nnsight.modeling.transformers.TransformersModel:{key_json}"}
    response = _HTTP.post(
        f"{server.url}/request",
        data={"data": json.dumps(data)},
        files={"blob": ("request", blob, "application/octet-stream")},
        headers=headers(key),
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()["id"]


def _wait(server, key, job_id, timeout=120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = _HTTP.get(f"{server.url}/response/{job_id}", headers=headers(key)).json()
        if latest["status"] in ("COMPLETED", "ERROR"):
            return latest
        time.sleep(0.05)
    raise AssertionError(f"{job_id} did not finish: {latest}")


def _new_key(server, email) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "keys", "create", "--email", email,
         "--data-dir", str(server.data_dir)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HF_HOME": str(server.hf_home)},
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


def test_fair_queue_lets_a_small_user_through_a_big_users_backlog(swap_server, swap_home):
    _, snapshots = swap_home
    key_a = _new_key(swap_server, "alice@example.org")
    key_b = _new_key(swap_server, "bob@example.org")
    model = local_model(snapshots[MODEL_A])
    blob = _payload(model, 0.02)
    # Hold the model busy while the backlog is submitted, so the order in which
    # the jobs run is the scheduler's choice, not the submission race's.
    blocker = _payload(model, 10.0)
    blockers = [_submit(swap_server, API_KEY, MODEL_A, blocker) for _ in range(AT_ONCE)]
    submitted = {}
    started = time.monotonic()
    for _ in range(200):
        submitted[_submit(swap_server, key_a, MODEL_A, blob)] = "A"
    for _ in range(5):
        submitted[_submit(swap_server, key_b, MODEL_A, blob)] = "B"
    print(f"submitted 205 jobs in {time.monotonic() - started:.1f}s")
    assert all(httpx.get(f"{swap_server.url}/response/{job}", headers=headers()).json()["status"]
               not in ("COMPLETED", "ERROR") for job in blockers), "the backlog took longer to submit than the blockers ran"
    for job_id, user in submitted.items():
        latest = _wait(swap_server, key_a if user == "A" else key_b, job_id, timeout=300)
        assert latest["status"] == "COMPLETED", latest
    jobs = httpx.get(
        f"{swap_server.url}/admin/jobs", params={"model": MODEL_A, "limit": 1000},
        headers=headers(),
    ).json()["jobs"]
    finished = {j["id"]: j for j in jobs if j["id"] in submitted}
    order = sorted(finished.values(), key=lambda j: j["updated_at"])
    owners = [submitted[j["id"]] for j in order]
    fiftieth_a = [i for i, owner in enumerate(owners) if owner == "A"][49]
    last_b = max(i for i, owner in enumerate(owners) if owner == "B")
    waits = {
        user: statistics.median(
            j["updated_at"] - j["created_at"] for j in order if submitted[j["id"]] == user
        )
        for user in ("A", "B")
    }
    print(f"median wait: A {waits['A']:.2f}s over 200 jobs, B {waits['B']:.2f}s over 5 jobs")
    assert last_b < fiftieth_a, owners[: last_b + 1]


def test_a_light_users_three_jobs_pass_a_heavy_users_sixteen(swap_server, swap_home):
    """Issue 23's fairness bar: at most 6 of the heavy user's jobs finish before the light user's last.

    Both users start with nothing used; the queue charges each the run time the
    server measured, so after the heavy user's first long job the light user's
    short ones go first.
    """
    _, snapshots = swap_home
    heavy = _new_key(swap_server, "heavy@example.org")
    light = _new_key(swap_server, "light@example.org")
    model = local_model(snapshots[MODEL_A])
    long_blob, short_blob = _payload(model, 0.3), _payload(model, 0.0)
    blocker = _payload(model, 5.0)
    blockers = [_submit(swap_server, API_KEY, MODEL_A, blocker) for _ in range(AT_ONCE)]
    submitted = {_submit(swap_server, heavy, MODEL_A, long_blob): "heavy" for _ in range(16)}
    submitted.update({_submit(swap_server, light, MODEL_A, short_blob): "light" for _ in range(3)})
    assert all(httpx.get(f"{swap_server.url}/response/{job}", headers=headers()).json()["status"]
               not in ("COMPLETED", "ERROR") for job in blockers), "the jobs took longer to submit than the blockers ran"
    for job_id, user in submitted.items():
        assert _wait(swap_server, heavy if user == "heavy" else light, job_id, timeout=300)["status"] == "COMPLETED"
    jobs = httpx.get(f"{swap_server.url}/admin/jobs", params={"model": MODEL_A, "limit": 1000},
                     headers=headers()).json()["jobs"]
    order = [submitted[j["id"]] for j in sorted(jobs, key=lambda j: j["updated_at"]) if j["id"] in submitted]
    last_light = max(i for i, user in enumerate(order) if user == "light")
    assert order[:last_light].count("heavy") <= 6, order


def test_cancel_a_queued_and_a_running_job(swap_server, swap_home):
    _, snapshots = swap_home
    model = local_model(snapshots[MODEL_A])
    runner = _payload(model, 3.0)
    running = [_submit(swap_server, API_KEY, MODEL_A, runner) for _ in range(AT_ONCE)]
    queued = _submit(swap_server, API_KEY, MODEL_A, _payload(model, 0.0))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = {httpx.get(f"{swap_server.url}/response/{job}", headers=headers()).json()["status"]
                  for job in running}
        if states == {"RUNNING"}:
            break
        time.sleep(0.05)
    for job_id in (queued, *running):
        response = httpx.post(f"{swap_server.url}/jobs/{job_id}/cancel", headers=headers())
        assert response.status_code == 200, response.text
    assert "cancelled while it was queued" in _wait(swap_server, API_KEY, queued)["description"]
    for job_id in running:
        assert "cancelled while it was running" in _wait(swap_server, API_KEY, job_id)["description"]
    other = _new_key(swap_server, "carol@example.org")
    job = _submit(swap_server, API_KEY, MODEL_A, _payload(model, 0.0))
    assert httpx.post(f"{swap_server.url}/jobs/{job}/cancel", headers=headers(other)).status_code == 404
    # The model keeps serving after its worker was restarted for the cancel.
    assert _wait(swap_server, API_KEY, job)["status"] == "COMPLETED"


def test_worker_killed_mid_job_fails_that_job_and_recovers(swap_server, swap_home):
    _, snapshots = swap_home
    model = local_model(snapshots[MODEL_A])
    job = _submit(swap_server, API_KEY, MODEL_A, _payload(model, 5.0))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(f"{swap_server.url}/response/{job}", headers=headers()).json()["status"] == "RUNNING":
            break
        time.sleep(0.05)
    pids = [e["pid"] for e in swap_server.status()["deployments"].values()
            if e["deployment"] == MODEL_A and e.get("pid")]
    os.kill(pids[0], signal.SIGKILL)
    failed = _wait(swap_server, API_KEY, job)
    assert failed["status"] == "ERROR" and "SIGKILL" in failed["description"], failed
    after = _submit(swap_server, API_KEY, MODEL_A, _payload(model, 0.0))
    assert _wait(swap_server, API_KEY, after)["status"] == "COMPLETED"


def test_server_killed_with_queued_jobs_runs_them_after_restart(root, swap_home):
    home, snapshots = swap_home
    model = local_model(snapshots[MODEL_A])
    expected = last_logits(model, False)["logits"]
    port = free_port()

    def server():
        # One job at a time: the three behind the first wait in the queue.
        return ServerProcess([MODEL_A], data_dir=root / "restart-data", hf_home=home, api_key=API_KEY,
                             port=port, extra_args=["--time-limit", "30", "--jobs-at-once", "1"])

    first = server().start()
    running = _submit(first, API_KEY, MODEL_A, _payload(model, 4.0))
    queued = [_submit(first, API_KEY, MODEL_A, _payload(model, 0.0)) for _ in range(3)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if httpx.get(f"{first.url}/response/{running}", headers=headers()).json()["status"] == "RUNNING":
            break
        time.sleep(0.05)
    first.stop(signal.SIGKILL)

    second = server().start()
    try:
        crashed = _wait(second, API_KEY, running)
        assert crashed["status"] == "ERROR" and "restarted while" in crashed["description"]
        for job_id in queued:
            done = _wait(second, API_KEY, job_id)
            assert done["status"] == "COMPLETED", done
            blob = httpx.get(done["data"]).content
            import io

            import torch

            result = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=False)
            torch.testing.assert_close(result["logits"], expected)
        # A graceful stop lets the running job finish first.
        slow = _submit(second, API_KEY, MODEL_A, _payload(model, 1.5))
        while httpx.get(f"{second.url}/response/{slow}", headers=headers()).json()["status"] != "RUNNING":
            time.sleep(0.05)
    finally:
        second.stop(signal.SIGTERM)
    third = server().start()
    try:
        assert _wait(third, API_KEY, slow)["status"] == "COMPLETED"
    finally:
        third.stop()

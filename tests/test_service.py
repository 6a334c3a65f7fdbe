"""The service endpoints and the refusals a user can meet, through the real client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from conftest import API_KEY, TEST_REPO

from nnhost.testing import ServerProcess


def test_status_shows_the_running_deployment(server):
    import nnsight

    status = nnsight.status()
    assert TEST_REPO in status
    entry = status[TEST_REPO]
    assert (entry["level"], entry["state"]) == ("HOT", "RUNNING")
    assert entry["task"] == "text-generation"
    assert status.status.value == "UP"
    assert "TransformersModel" in str(status)


def test_compare_reads_the_server_environment(server):
    import nnsight

    comparison = nnsight.compare()
    for package in ("nnsight", "torch", "transformers"):
        assert comparison.packages[package]["remote"] != "-"
    # Same machine, same virtualenv: nothing critical differs.
    assert comparison.critical_mismatches == {}
    assert comparison.python_matches


def test_whoami_and_login(server, root):
    import nnsight

    assert nnsight.whoami() == {"email": "admin@localhost", "tags": ["admin"]}
    assert nnsight.whoami("nnh_not_a_key") == {"email": None, "tags": []}
    command = subprocess.run(
        [sys.executable, "-c", "from nnsight.ndif import main; main()", "whoami"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=60,
    )
    assert command.stdout.strip() == "admin@localhost", command.stderr
    login = subprocess.run(
        [sys.executable, "-c", f"import nnsight; nnsight.login({API_KEY!r})"],
        capture_output=True,
        text=True,
        env={**os.environ, "NNSIGHT_CONFIG": str(root / "login.yaml"), "NDIF_API_KEY": ""},
        timeout=60,
    )
    assert "logged in as admin@localhost" in login.stdout, login.stderr
    assert API_KEY in (root / "login.yaml").read_text()


def test_ping(server):
    assert httpx.get(f"{server.url}/ping").text.strip('"') == "pong"


def _post(server, key=API_KEY, model_key=None, headers=None, blob=b"x"):
    model_key = model_key or (
        'nnsight.modeling.transformers.TransformersModel:{"repo_id": "%s", '
        '"revision": null, "task": "text-generation"}' % TEST_REPO
    )
    all_headers = {"nnsight-version": "0.8.1", **(headers or {})}
    if key is not None:
        all_headers["ndif-api-key"] = key
    return httpx.post(
        f"{server.url}/request",
        data={"data": json.dumps({"model_key": model_key})},
        files={"blob": ("request", blob, "application/octet-stream")},
        headers=all_headers,
    )


def test_missing_key_is_401_saying_how_to_set_it(server, remote_model):
    from nnsight import CONFIG
    from nnsight.intervention.backends.remote import RemoteError

    response = _post(server, key=None)
    assert response.status_code == 401
    assert "NDIF_API_KEY" in response.json()["detail"]
    previous = CONFIG.API.APIKEY
    CONFIG.API.APIKEY = ""
    try:
        with pytest.raises(RemoteError, match="NDIF_API_KEY"):
            with remote_model.trace("Hello", remote=True):
                out = remote_model.lm_head.output.save()
    finally:
        CONFIG.API.APIKEY = previous


def test_unknown_key_is_403(server):
    response = _post(server, key="nnh_unknown")
    assert response.status_code == 403
    assert "not known" in response.json()["detail"]


def test_unknown_model_is_refused_listing_what_is_served(server):
    other = (
        'nnsight.modeling.transformers.TransformersModel:{"repo_id": "openai-community/gpt2", '
        '"revision": null, "task": "text-generation"}'
    )
    response = _post(server, model_key=other)
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert "openai-community/gpt2" in detail and TEST_REPO in detail


def test_bad_envelopes_are_422(server):
    response = _post(server, model_key="no-colon-here")
    assert response.status_code == 422 and "model_key" in response.json()["detail"]
    response = httpx.post(
        f"{server.url}/request",
        data={"data": "{not json"},
        files={"blob": ("request", b"x", "application/octet-stream")},
        headers={"ndif-api-key": API_KEY},
    )
    assert response.status_code == 422 and "'data'" in response.json()["detail"]


def test_unserved_clients_are_told_the_versions_served(server):
    for sent in ("0.4.3", "0.5.15", "1.0"):
        response = _post(server, headers={"nnsight-version": sent})
        assert response.status_code == 400
        detail = response.json()["detail"]
        assert f"runs nnsight {sent}" in detail and "pip install nnsight==0.8.1" in detail, detail


def test_a_payload_that_is_not_a_trace_ends_in_error_not_a_crash(server, remote_model):
    job = _post(server, blob=b"definitely not a pickle").json()
    assert job["status"] == "RECEIVED"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        latest = httpx.get(f"{server.url}/response/{job['id']}", headers={"ndif-api-key": API_KEY}).json()
        if latest["status"] in ("COMPLETED", "ERROR"):
            break
        time.sleep(0.1)
    assert latest["status"] == "ERROR"
    assert "could not read your request" in latest["description"]
    assert "runtime" in latest["meta"] or "total_seconds" in latest["meta"]


def test_response_and_result_links_are_guarded(server, remote_model):
    response = httpx.get(f"{server.url}/response/0123abcd", headers={"ndif-api-key": API_KEY})
    assert response.status_code == 404
    with remote_model.trace("Hello", remote=True, blocking=False) as tracer:
        out = remote_model.lm_head.output.save()
    job_id = tracer.backend.job_id
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        latest = httpx.get(f"{server.url}/response/{job_id}", headers={"ndif-api-key": API_KEY}).json()
        if latest["status"] == "COMPLETED":
            break
        time.sleep(0.1)
    url = latest["data"]
    good = httpx.get(url)
    assert good.status_code == 200
    assert int(good.headers["content-length"]) == len(good.content) > 0
    assert httpx.get(url.replace("sig=", "sig=0")).status_code == 403
    assert httpx.get(url.replace(job_id, "f" * 32)).status_code == 403


def test_deploying_is_reported_until_the_model_is_loaded_and_queued_jobs_then_run(
    root, server_hf_home, test_snapshot
):
    """A fresh server reports DEPLOYING, accepts work meanwhile, and runs it once loaded."""
    process = ServerProcess(
        [TEST_REPO], data_dir=root / "deploying-data", hf_home=server_hf_home, api_key=API_KEY
    )
    env = {**os.environ, "HF_HOME": str(server_hf_home), "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable, "-m", "nnhost.cli", "serve", TEST_REPO, "--port", str(process.port),
        "--data-dir", str(process.data_dir), "--api-key", API_KEY, "--log-level", "warning",
    ]
    process.data_dir.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        states = []
        job = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                entry = httpx.get(f"{process.url}/status", timeout=2).json()["deployments"][TEST_REPO]
            except (httpx.HTTPError, KeyError):
                time.sleep(0.05)
                continue
            states.append(entry["application_state"])
            if job is None:
                job = _post(process).json()
                queued = httpx.get(
                    f"{process.url}/response/{job['id']}", headers={"ndif-api-key": API_KEY}
                ).json()
            if entry["application_state"] == "RUNNING":
                break
            time.sleep(0.05)
        assert states[0] in ("NOT_STARTED", "DEPLOYING") and states[-1] == "RUNNING", states
        assert queued["status"] == "DEPLOYING", queued
        assert f"Deploying {TEST_REPO}" in queued["description"], queued
        while time.monotonic() < deadline:
            latest = httpx.get(
                f"{process.url}/response/{job['id']}", headers={"ndif-api-key": API_KEY}
            ).json()
            if latest["status"] in ("COMPLETED", "ERROR"):
                break
            time.sleep(0.1)
        # The blob was junk, so it fails, but only after the model came up and ran it.
        assert latest["status"] == "ERROR" and "could not read" in latest["description"]
    finally:
        child.terminate()
        child.wait(timeout=30)

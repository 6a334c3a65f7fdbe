"""The result store's contract, run against both stores: a directory and S3.

S3 is real S3 over HTTP: moto's server mode on a loopback port (`moto_s3`).
The directory store's signed links are served by the real nnhost server of
the session (its `/result/{id}` route, with its own signing key), so both
stores' links are fetched the way the nnsight client fetches them: a plain
httpx GET, no key, no redirect. Also: the settings that choose a store refuse
bad values, and `nnhost serve` refuses a store it cannot use.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from conftest import API_KEY, TEST_REPO
from moto_s3 import CREDENTIALS, S3Endpoint, aws_environment

from nnhost.config import Settings, SettingsError, load_settings
from nnhost.controller.service import JobService
from nnhost.jobs.job import Job, Status
from nnhost.jobs.store import JobStore, connect
from nnhost.storage.links import LinkSigner
from nnhost.storage.results import DirectoryStore, ResultMissing, ResultStore
from nnhost.storage.s3 import S3Store, parse_s3_url

BUCKET = "nnhost-contract"


@pytest.fixture(scope="module")
def s3():
    with aws_environment():
        endpoint = S3Endpoint().start()
        endpoint.bucket(BUCKET)
        yield endpoint
        endpoint.stop()


@pytest.fixture(params=["directory", "s3"])
def store(request, tmp_path, server):
    if request.param == "directory":
        # The session server's own folder and key: its /result route serves these links.
        signer = LinkSigner.from_file(server.data_dir / "secrets" / "link-signing.key")
        made = DirectoryStore(server.data_dir / "results", signer)
    else:
        s3 = request.getfixturevalue("s3")
        prefix = f"contract/{uuid.uuid4().hex[:8]}"
        made = S3Store(f"s3://{BUCKET}/{prefix}", endpoint=s3.url, spool=tmp_path / "spool")
    made.check()
    written: list[str] = []
    made.new_id = lambda: written.append(uuid.uuid4().hex) or written[-1]
    yield made
    for job_id in written:
        made.delete(job_id)


def test_both_stores_are_result_stores(store):
    assert isinstance(store, ResultStore)


def test_a_committed_result_is_what_the_worker_wrote_with_the_stored_size(store):
    job_id = store.new_id()
    data = bytes(range(256)) * 4099  # over a MiB: more than one read, a multipart upload
    staged = store.staging_path(job_id)
    staged.write_bytes(data)
    assert not store.exists(job_id) and store.size(job_id) is None  # staged is not stored
    assert store.commit(job_id) == len(data)
    assert not staged.exists()
    assert store.exists(job_id) and store.size(job_id) == len(data)
    assert store.read(job_id) == data
    with store.open(job_id) as body:
        parts = []
        while chunk := body.read(100_000):
            parts.append(chunk)
    assert b"".join(parts) == data


def test_nothing_staged_commits_to_nothing(store):
    job_id = store.new_id()
    assert store.commit(job_id) is None
    with pytest.raises(ResultMissing):
        store.open(job_id)
    with pytest.raises(ResultMissing):
        store.read(job_id)


def test_a_job_id_is_never_a_path(store):
    for bad in ("../escape", "a/b", "", "x.result"):
        with pytest.raises(ValueError):
            store.staging_path(bad)
        with pytest.raises(ValueError):
            store.write(bad, b"x")


def test_the_signed_url_gets_the_result_with_a_plain_get(store, server):
    job_id, other = store.new_id(), store.new_id()
    store.write(job_id, b"the result")
    store.write(other, b"someone else's")
    url = store.signed_url(job_id, 60, server.url)
    # As the nnsight client downloads: httpx, no key, no header, redirects not followed.
    with httpx.Client(follow_redirects=False) as client:
        answer = client.get(url)
        assert answer.status_code == 200 and answer.content == b"the result"
        assert int(answer.headers["content-length"]) == len(b"the result")
        if isinstance(store, S3Store):
            # moto does not check signatures or expiry (AWS does): check what AWS checks.
            query = parse_qs(urlsplit(url).query)
            assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
            assert query["X-Amz-SignedHeaders"] == ["host"]  # a plain GET carries all it needs
            assert query["X-Amz-Expires"] == ["60"]
            month = parse_qs(urlsplit(store.signed_url(job_id, 30 * 86400, "")).query)
            assert month["X-Amz-Expires"] == [str(7 * 86400)]  # SigV4's longest
        else:
            assert client.get(url.replace(job_id, other)).status_code == 403
            short = store.signed_url(job_id, 1, server.url)
            time.sleep(2.2)
            assert client.get(short).status_code == 403  # expired
        store.delete(job_id)
        assert client.get(store.signed_url(job_id, 60, server.url)).status_code in (404, 410)


def test_delete_removes_the_result_and_its_staged_file_and_may_repeat(store):
    job_id = store.new_id()
    store.write(job_id, b"result")
    store.staging_path(job_id).write_bytes(b"half")
    store.delete(job_id)
    assert not store.exists(job_id) and not store.staging_path(job_id).exists()
    store.delete(job_id)


def test_expire_removes_only_what_was_written_before(store):
    old, staged = store.new_id(), store.new_id()
    store.write(old, b"old")
    store.staging_path(staged).write_bytes(b"never finished")
    assert store.expire(time.time() - 3600) == 0
    assert store.exists(old) and store.staging_path(staged).exists()
    time.sleep(1.1)
    # S3 keeps LastModified to the second (rounded down): cut at a whole second,
    # after everything above and before what follows.
    cutoff = float(int(time.time()))
    fresh = store.new_id()
    store.write(fresh, b"fresh")
    assert store.expire(cutoff) >= 1
    assert not store.exists(old) and not store.staging_path(staged).exists()
    assert store.exists(fresh)


def test_the_sweep_deletes_expired_results_from_the_store(store, tmp_path):
    jobs = JobStore(connect(tmp_path / "db.sqlite3"))
    service = JobService(Settings(data_dir=tmp_path), jobs, None, None, None, None, store)
    expired, kept = store.new_id(), store.new_id()
    for job_id, expires in ((expired, time.time() - 1), (kept, time.time() + 3600)):
        jobs.create(Job(id=job_id, user_id=1, model_key="k", deployment="d"))
        for status in (Status.QUEUED, Status.DISPATCHED, Status.RUNNING):
            jobs.transition(job_id, status, "")
        store.write(job_id, b"result bytes")
        jobs.transition(job_id, Status.COMPLETED, "", result_size=12, result_expires_at=expires)
    assert asyncio.run(service.sweep_results()) == 1
    assert not store.exists(expired) and store.exists(kept)
    assert jobs.get(expired).result_expires_at is None


# -- choosing a store ------------------------------------------------------------------


@pytest.mark.parametrize("overrides, says", [
    ({"results": "s3://Bad_Bucket"}, "not a valid bucket name"),
    ({"results": "s3://"}, "names no bucket"),
    ({"results": "s3://bucket/a//b"}, "prefix"),
    ({"results": "s3://bucket?x=1"}, "no query"),
    ({"results": "gs://bucket"}, "s3://BUCKET[/PREFIX]"),
    ({"results": "s3://bucket", "results_endpoint": "localhost:9000"}, "endpoint's URL"),
    ({"results_endpoint": "http://127.0.0.1:9000"}, "only used with s3:// results"),
])
def test_bad_result_settings_stop_the_server_saying_why(overrides, says, tmp_path):
    with pytest.raises(SettingsError) as caught:
        load_settings({"data_dir": str(tmp_path), **overrides})
    assert says in str(caught.value)


def test_result_settings_name_a_directory_or_a_bucket(tmp_path):
    assert load_settings({"data_dir": str(tmp_path)}).results_dir == tmp_path.resolve() / "results"
    shared = load_settings({"data_dir": str(tmp_path), "results": str(tmp_path / "shared")})
    assert shared.results_dir == tmp_path / "shared"
    bucket = load_settings({
        "data_dir": str(tmp_path), "results": "s3://my-bucket/runs/",
        "results_endpoint": "http://127.0.0.1:9000/",
    })
    assert bucket.results == "s3://my-bucket/runs" and bucket.results_dir is None
    assert bucket.results_endpoint == "http://127.0.0.1:9000"
    assert parse_s3_url("s3://my-bucket/runs/2026").key("abc") == "runs/2026/abc.result"


def test_serve_refuses_a_results_directory_it_cannot_make(tmp_path, server_hf_home, test_snapshot):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "serve", TEST_REPO, "--data-dir", str(tmp_path / "d"),
         "--api-key", API_KEY, "--port", "1", "--results", str(blocker / "results")],
        env={**os.environ, "HF_HOME": str(server_hf_home), "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot make the results directory" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("target, env, says", [
    ("s3://no-such-bucket", CREDENTIALS, "the bucket does not exist"),
    (f"s3://{BUCKET}", {"AWS_EC2_METADATA_DISABLED": "true"}, "no credentials"),
])
def test_serve_refuses_a_store_it_cannot_use(s3, tmp_path, server_hf_home, test_snapshot,
                                             target, env, says):
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "HF_HOME": str(server_hf_home), "HF_HUB_OFFLINE": "1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "serve", TEST_REPO, "--data-dir", str(tmp_path / "d"),
         "--api-key", API_KEY, "--port", "1", "--results", target, "--results-endpoint", s3.url],
        env=environ, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert says in done.stderr and target in done.stderr


def test_contained_workers_cannot_see_a_results_directory_outside_the_data_dir(tmp_path):
    from nnhost.execution.policy import policy_from_settings

    inside = load_settings({"data_dir": str(tmp_path / "d")})
    outside = load_settings({"data_dir": str(tmp_path / "d"), "results": str(tmp_path / "shared")})
    assert str(tmp_path / "shared") in policy_from_settings(outside).limits.hide
    assert str(inside.results_dir) not in policy_from_settings(inside).limits.hide  # under d
    assert str(tmp_path / "d") in policy_from_settings(inside).limits.hide


# -- the job service on an S3 store, in-process (fake replicas, real S3) -------------------


def test_the_service_announces_a_job_only_once_s3_holds_its_result(s3, tmp_path):
    from test_service_inprocess import ADA, World, spec, updates

    async def body():
        results = S3Store(f"s3://{BUCKET}/service", endpoint=s3.url, spool=tmp_path / "spool")
        world = await World(tmp_path, [spec("org/a")], results=results).start()
        replica = world.replica("org/a")
        session = await world.bus.open(ADA.user_id)
        job_id = await world.submit(ADA, "org/a", session.id)
        replica.run()
        replica.complete(b"r" * 100)
        await world.settle()
        job = world.store.get(job_id)
        assert job.status is Status.COMPLETED and job.result_size == 100
        assert results.read(job_id) == b"r" * 100
        assert list((tmp_path / "spool").iterdir()) == []  # the spool copy is gone
        frames = updates(session)
        assert frames[-1].status == "COMPLETED"
        assert frames[-1].inline == b"r" * 100  # inline, read back from S3

    asyncio.run(body())


def test_a_result_that_cannot_be_uploaded_ends_the_job_with_an_error(s3, tmp_path):
    from test_service_inprocess import ADA, World, spec

    async def body():
        # No such bucket: every upload fails (the startup check would have refused it).
        results = S3Store("s3://no-such-bucket", endpoint=s3.url, spool=tmp_path / "spool")
        world = await World(tmp_path, [spec("org/a")], results=results).start()
        replica = world.replica("org/a")
        job_id = await world.submit(ADA, "org/a")
        replica.run()
        replica.complete(b"lost")
        await world.settle()
        job = world.store.get(job_id)
        assert job.status is Status.ERROR and "could not be stored" in job.description
        assert list((tmp_path / "spool").iterdir()) == []
        # The next job still runs.
        second = await world.submit(ADA, "org/a")
        assert replica.current.job_id == second

    asyncio.run(body())

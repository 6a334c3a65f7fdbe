"""End to end with results in S3: a real server on `--results s3://...`, the real client.

The server is `nnhost serve --results s3://BUCKET/runs --results-endpoint URL`
against moto's S3 server on loopback, with the dummy credentials in the
standard AWS environment variables. Its inline limit is low, so one trace's
result rides the websocket and another's is downloaded by the unmodified
nnsight client from the presigned S3 URL the COMPLETED response carries; both
must equal the same code run locally. Every result is an object in the
bucket (none is left in the spool), and is gone once its retention ends.
"""

from __future__ import annotations

import time

import httpx
import pytest
from compare import assert_same
from conftest import API_KEY, TEST_REPO
from moto_s3 import CREDENTIALS, S3Endpoint

from nnhost.testing import ServerProcess

BUCKET = "nnhost-results"
PREFIX = "runs/"
INLINE = 8 * 1024
#: Seconds a result is kept: long enough to download it, short enough to watch it go.
RETENTION = 10
PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture(scope="module")
def s3():
    endpoint = S3Endpoint().start()
    endpoint.bucket(BUCKET)
    yield endpoint
    endpoint.stop()


@pytest.fixture(scope="module")
def s3_server(root, server_hf_home, test_snapshot, server, s3):
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / "s3-data",
        hf_home=server_hf_home,
        api_key=API_KEY,
        extra_args=["--results", f"s3://{BUCKET}/{PREFIX}", "--results-endpoint", s3.url],
        env={
            **CREDENTIALS,
            "NNHOST_INLINE_RESULT_BYTES": str(INLINE),
            "NNHOST_RESULT_RETENTION": str(RETENTION),
        },
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture
def client_of(s3_server):
    from nnsight import CONFIG

    previous = CONFIG.API.HOST
    CONFIG.API.HOST = s3_server.url
    yield s3_server
    CONFIG.API.HOST = previous


def stored(s3) -> dict[str, int]:
    answer = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)
    return {item["Key"]: item["Size"] for item in answer.get("Contents", ())}


def next_token(model, remote):
    with model.trace(PROMPT, remote=remote):
        token = model.lm_head.output[0, -1].argmax(dim=-1).save()
    return token


def all_logits(model, remote):
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].output.save()
        logits = model.lm_head.output.save()
    return {"hidden": hidden, "logits": logits}


def run_once(s3, program, remote_model, local_model) -> tuple[str, int]:
    """Run ``program`` remotely and locally, compare, and return its new object and size."""
    before = stored(s3)
    remote = program(remote_model, True)
    assert_same(remote, program(local_model, False))
    new = {key: size for key, size in stored(s3).items() if key not in before}
    assert len(new) == 1, f"one object per result, got {sorted(new)}"
    return next(iter(new.items()))


def test_a_small_result_rides_the_websocket_and_is_kept_in_the_bucket(
    client_of, s3, remote_model, local_model
):
    key, size = run_once(s3, next_token, remote_model, local_model)
    assert key.startswith(PREFIX) and key.endswith(".result")
    assert size <= INLINE  # under the limit: sent inline on COMPLETED
    assert list((client_of.data_dir / "spool").iterdir()) == []


def test_a_large_result_is_downloaded_from_its_presigned_url(
    client_of, s3, remote_model, local_model
):
    key, size = run_once(s3, all_logits, remote_model, local_model)
    assert size > INLINE  # over the limit: the client fetched it from S3 itself
    assert list((client_of.data_dir / "spool").iterdir()) == []


def completed_update(model, large: bool):
    """A trace through the async backend: (its COMPLETED update, the saves)."""
    import asyncio

    from nnsight.intervention.backends.remote import AsyncRemoteBackend

    backend = AsyncRemoteBackend(model.to_model_key())
    with model.trace(PROMPT, backend=backend):
        if large:
            hidden = model.transformer.h[0].output.save()  # noqa: F841 (saves go by name)
            logits = model.lm_head.output.save()  # noqa: F841
        else:
            token = model.lm_head.output[0, -1].argmax(dim=-1).save()  # noqa: F841

    async def consume():
        return [update async for update in backend]

    updates = asyncio.run(consume())
    return updates[-2], updates[-1]


def test_completed_carries_the_bytes_under_the_limit_and_a_presigned_url_over_it(
    client_of, s3, remote_model, local_model
):
    small, saves = completed_update(remote_model, large=False)
    assert small.status.value == "COMPLETED" and isinstance(small.data, bytes)
    assert_same(saves, {"token": next_token(local_model, False)})
    large, saves = completed_update(remote_model, large=True)
    assert large.status.value == "COMPLETED" and isinstance(large.data, str)
    assert large.data.startswith(f"{s3.url}/{BUCKET}/{PREFIX}") and "X-Amz-Signature=" in large.data
    assert_same(saves, all_logits(local_model, False))


def test_a_polled_job_gets_a_presigned_url_of_its_object(client_of, s3, remote_model, local_model):
    with remote_model.trace(PROMPT, remote=True, blocking=False) as tracer:
        logits = remote_model.lm_head.output.save()  # noqa: F841 (the saves are named by it)
    backend = tracer.backend
    deadline = time.monotonic() + 120
    result = backend()
    while result is None and time.monotonic() < deadline:
        time.sleep(0.1)
        result = backend()
    assert result is not None, f"job never completed; last status {backend.status}"
    with local_model.trace(PROMPT):
        local = local_model.lm_head.output.save()
    assert_same(result["logits"], local)
    # What the client polled: COMPLETED with a presigned GET of the object in the bucket.
    answer = httpx.get(f"{client_of.url}/response/{backend.job_id}",
                       headers={"ndif-api-key": API_KEY}, timeout=10).json()
    assert answer["status"] == "COMPLETED"
    url = answer["data"]
    assert url.startswith(f"{s3.url}/{BUCKET}/{PREFIX}{backend.job_id}.result?")
    assert "X-Amz-Signature=" in url
    body = s3.client().get_object(Bucket=BUCKET, Key=f"{PREFIX}{backend.job_id}.result")["Body"]
    assert httpx.get(url).content == body.read()


def test_results_are_deleted_from_the_bucket_when_their_retention_ends(
    client_of, s3, remote_model, local_model
):
    run_once(s3, next_token, remote_model, local_model)
    kept = stored(s3)  # this one, and those of the tests above that are still kept
    deadline = time.monotonic() + RETENTION + 60
    while set(kept) & set(stored(s3)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(kept) & set(stored(s3)), "results outlived their retention"
    job_id = next(iter(kept))[len(PREFIX):-len(".result")]
    answer = httpx.get(f"{client_of.url}/response/{job_id}",
                       headers={"ndif-api-key": API_KEY}, timeout=10).json()
    assert answer["status"] == "COMPLETED" and answer["data"] is None

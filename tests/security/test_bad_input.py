"""Malformed input at the API: a clear refusal every time, never a 500, never a dead worker."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from .conftest import MAX_REQUEST_BYTES
from .helpers import HEADERS, MODEL_KEY, post, run_blob, serialized_request, wait_final


def _raw_request(server, headers: dict, body_chunks, read_timeout: float = 15) -> bytes:
    """Send a request by hand, stop sending, and return what the server answered."""
    host, port = server.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as connection:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        connection.sendall(f"POST /request HTTP/1.1\r\nHost: {host}\r\n{head}\r\n".encode())
        for chunk in body_chunks:
            connection.sendall(chunk)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = connection.recv(65536)
            if not data:
                break
            answer += data
        return answer


def _multipart_head() -> bytes:
    return (
        b"--cut\r\nContent-Disposition: form-data; name=\"data\"\r\n\r\n"
        + json.dumps({"model_key": MODEL_KEY}).encode()
        + b"\r\n--cut\r\nContent-Disposition: form-data; name=\"blob\"; filename=\"b\"\r\n"
        b"Content-Type: application/octet-stream\r\n\r\n"
    )


def test_body_over_the_cap_is_413_from_its_declared_length(serving):
    response = post(serving, b"x" * (MAX_REQUEST_BYTES + 1))
    assert response.status_code == 413
    assert "over this server's limit of 4,194,304 bytes" in response.json()["detail"]
    # Declared 1 GB, nothing sent: the answer comes without waiting for the body.
    answer = _raw_request(
        serving,
        {**HEADERS, "Content-Type": "multipart/form-data; boundary=cut", "Content-Length": str(10**9)},
        [],
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_chunked_body_over_the_cap_is_413_while_streaming(serving):
    """No length declared: the server stops at the cap and answers, with most of the body unsent."""

    def chunk(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    body = [chunk(_multipart_head())] + [chunk(b"y" * 100_000)] * 45  # ~4.5 MB of a "40 MB" body
    answer = _raw_request(
        serving,
        {
            **HEADERS,
            "Content-Type": "multipart/form-data; boundary=cut",
            "Transfer-Encoding": "chunked",
        },
        body,
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


@pytest.mark.parametrize(
    "data, field",
    [
        ("{not json", "'data'"),
        (json.dumps({"session_id": ""}), "model_key"),
        (json.dumps({"model_key": MODEL_KEY, "compress": "very"}), "compress"),
        (json.dumps({"model_key": MODEL_KEY, "env": ["a", "list"]}), "env"),
        (json.dumps([1, 2, 3]), "data"),
        (json.dumps({"model_key": 42}), "model_key"),
        (json.dumps({"model_key": "no-colon-here"}), "model_key"),
    ],
    ids=["not-json", "no-model-key", "compress-type", "env-type", "array", "key-type", "key-shape"],
)
def test_bad_envelope_is_422_naming_the_field(serving, data, field):
    response = post(serving, b"blob", data=data)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]


def test_missing_or_empty_blob_is_422(serving):
    response = httpx.post(
        f"{serving.url}/request",
        data={"data": json.dumps({"model_key": MODEL_KEY})},
        headers=HEADERS,
    )
    assert response.status_code in (400, 422) and "blob" in response.json()["detail"]
    response = post(serving, b"")
    assert response.status_code == 422 and "empty" in response.json()["detail"]


def test_unknown_model_and_old_client_are_refused(serving):
    other = MODEL_KEY.replace("nnhost-test/tiny-gpt2", "someone/else")
    response = post(serving, b"x", data=json.dumps({"model_key": other}))
    assert response.status_code == 404 and "someone/else" in response.json()["detail"]
    response = post(serving, b"x", headers={"nnsight-version": "0.3.0"})
    assert response.status_code == 400 and "pip install nnsight==0.8.1" in response.json()["detail"]


def test_blob_problems_end_in_error_with_a_reason(serving, remote_model):
    plain = serialized_request(remote_model, compress=False)
    packed = serialized_request(remote_model, compress=True)
    cases = [
        (b"\x28\xb5\x2f\xfd" + b"\x00" * 40, True, "not valid zstd"),  # bad zstd frame
        (packed[: len(packed) // 2], True, "could not read your request"),  # truncated zstd
        (plain, True, "not valid zstd"),  # said compress, sent plain
        (packed, False, "could not read your request"),  # said plain, sent zstd
        (plain[: len(plain) // 2], False, "could not read your request"),  # truncated pickle
        (b"\x80\x04" + b"\xff" * 64, False, "could not read your request"),  # bad opcodes
    ]
    for blob, compress, reason in cases:
        final = run_blob(serving, blob, compress=compress)
        assert final["status"] == "ERROR", final
        assert reason in final["description"], final["description"]
    # The intact payloads themselves run fine.
    assert run_blob(serving, plain, compress=False)["status"] == "COMPLETED"
    assert run_blob(serving, packed, compress=True)["status"] == "COMPLETED"


def test_bad_requests_do_not_affect_another_users_job(serving, remote_model, local_reference):
    """Junk arriving while a good job waits and runs leaves that job's values intact."""
    from compare import assert_same

    from .helpers import normal_program

    outcome = {}

    def good():
        outcome["result"] = normal_program(remote_model, serving.url)

    thread = threading.Thread(target=good)
    thread.start()
    statuses = []
    jobs = []
    for index in range(30):
        response = post(serving, bytes([index]) * (index + 1))
        statuses.append(response.status_code)
        if response.status_code == 200:
            jobs.append(response.json()["id"])
        statuses.append(post(serving, b"x", data="{").status_code)
    thread.join(timeout=120)
    assert 500 not in statuses
    assert_same(outcome["result"], local_reference)
    for job in jobs:
        assert wait_final(serving, job)["status"] == "ERROR"


def test_an_env_too_large_to_hand_off_is_refused_at_intake(serving, remote_model):
    """It once reached the replica, failed the hand-off and left the model stuck for everyone."""
    from nnhost.wire import MAX_ENV_BYTES

    envelope = json.dumps({"model_key": MODEL_KEY, "env": {"adapter": "x" * (MAX_ENV_BYTES + 1)}})
    response = post(serving, serialized_request(remote_model), data=envelope)
    assert response.status_code == 422, response.text
    assert "the request's env is" in response.json()["detail"]
    assert "over this server's limit of 65,536" in response.json()["detail"]

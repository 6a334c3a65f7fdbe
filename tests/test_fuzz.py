"""Thousands of mangled requests at /request: no 500s, no lasting damage.

Real payloads from the nnsight client are mutated (bit flips, overwritten runs,
truncations, splices of two payloads, inserted junk, a wrong ``compress`` flag)
and so are the JSON envelopes around them (wrong types, huge strings, unknown
keys, broken JSON). Everything is seeded, and bounded by a count of cases. The API must
never answer 5xx; every accepted job must end (ERROR or COMPLETED); the worker
may die only if it comes back; and afterwards a normal request must give the
same values as the same code run locally.
"""

from __future__ import annotations

import json
import random
import time

import httpx
import pytest
from compare import assert_same
from conftest import API_KEY, TEST_REPO

from nnhost.testing import ServerProcess

SEED = 20240611
#: Cases sent, whatever time they take (a count, never a rate: these machines are shared).
CASES = 1000
PROMPT = "The Eiffel Tower is in the city of"
MODEL_KEY = (
    'nnsight.modeling.transformers.TransformersModel:{"repo_id": "%s", '
    '"revision": null, "task": "text-generation"}' % TEST_REPO
)
HEADERS = {"ndif-api-key": API_KEY, "nnsight-version": "0.8.1"}


@pytest.fixture(scope="module")
def fuzz_server(root, server_hf_home, test_snapshot):
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / "fuzz-data",
        hf_home=server_hf_home,
        api_key=API_KEY,
        extra_args=["--time-limit", "3", "--kill-grace", "1"],
        env={"NNHOST_MAX_REQUEST_BYTES": str(1 << 20), "NNHOST_MAX_RESULT_BYTES": str(1 << 20)},
    )
    process.start()
    yield process
    process.stop()


class _Capture:
    def __init__(self, compress: bool) -> None:
        self.compress = compress
        self.blob = b""

    def __call__(self, tracer) -> None:
        from nnsight.schema.request import RequestModel

        self.blob = RequestModel.serialize(tracer, self.compress)


def _seeds(model) -> list[tuple[bytes, bool]]:
    """Real payloads: a few programs, each plain and compressed."""
    import torch

    steer = torch.ones(64)
    seeds = []
    for compress in (False, True):
        capture = _Capture(compress)
        with model.trace(PROMPT, backend=capture):
            logits = model.lm_head.output.save()
        seeds.append((capture.blob, compress))
        capture = _Capture(compress)
        with model.trace(PROMPT, backend=capture):
            model.transformer.h[0].output[:, -1] += steer
            hidden = model.transformer.h[1].output.save()
        seeds.append((capture.blob, compress))
        capture = _Capture(compress)
        with model.trace(backend=capture) as tracer:
            with tracer.invoke(PROMPT):
                first = model.lm_head.output[:, -1].save()
            with tracer.invoke("Hello world"):
                second = model.lm_head.output[:, -1].save()
        seeds.append((capture.blob, compress))
    return seeds


def _mutate_blob(rng: random.Random, seeds) -> tuple[bytes, bool]:
    blob, compress = rng.choice(seeds)
    data = bytearray(blob)
    kind = rng.randrange(7)
    if kind == 0:  # flip a few bits
        for _ in range(rng.randint(1, 8)):
            position = rng.randrange(len(data))
            data[position] ^= 1 << rng.randrange(8)
    elif kind == 1:  # overwrite a run
        start = rng.randrange(len(data))
        for position in range(start, min(len(data), start + rng.randint(1, 32))):
            data[position] = rng.randrange(256)
    elif kind == 2:  # truncate
        data = data[: rng.randrange(1, len(data))]
    elif kind == 3:  # splice two payloads
        other, _ = rng.choice(seeds)
        data = data[: rng.randrange(len(data))] + bytearray(other[rng.randrange(len(other)) :])
    elif kind == 4:  # insert junk
        position = rng.randrange(len(data))
        data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == 5:  # duplicate a chunk
        start = rng.randrange(len(data))
        data[start:start] = data[start : start + rng.randint(1, 256)]
    if rng.random() < 0.1:
        compress = not compress  # the wrong flag
    return bytes(data) or b"\x00", compress


def _mutate_envelope(rng: random.Random) -> tuple[str, dict]:
    """A broken ``data`` field (and sometimes broken form parts)."""
    junk_values = [
        None, 0, -1, 1.5, True, "", "x" * rng.choice([1, 100, 70_000]), [], {}, [1, "a"],
        {"nested": {"deeper": [None]}}, "\u0000\ud7ff\u2603", MODEL_KEY + "#", "a:b", ":",
    ]
    envelope = {"model_key": MODEL_KEY, "session_id": "", "compress": False, "env": {}}
    kind = rng.randrange(6)
    if kind == 0:
        envelope[rng.choice(list(envelope))] = rng.choice(junk_values)
    elif kind == 1:
        del envelope[rng.choice(list(envelope))]
    elif kind == 2:
        envelope[rng.choice(["extra", "__proto__", "model", "blob"])] = rng.choice(junk_values)
    elif kind == 3:
        text = json.dumps(envelope)
        cut = rng.randrange(len(text))
        return text[:cut] + rng.choice(["", "}", "{", "\\", '"', "\x00"]), {}
    elif kind == 4:
        envelope["session_id"] = rng.choice(["not-mine", "0" * 32, "x" * 5000])
    else:
        envelope["env"] = rng.choice([{"attn_implementation": "nope"}, {"peft": "x/y"}, {"": None}])
    return json.dumps(envelope, default=str), {}


def _final(client: httpx.Client, server, job_id: str) -> dict:
    return client.get(f"{server.url}/response/{job_id}", headers=HEADERS).json()


def test_fuzzed_requests_never_break_the_server(fuzz_server, remote_model, local_model):
    rng = random.Random(SEED)
    seeds = _seeds(remote_model)
    statuses: dict[int, int] = {}
    jobs: list[str] = []
    sent = 0
    started = time.monotonic()
    with httpx.Client(timeout=30) as client:
        while sent < CASES:
            if rng.random() < 0.7:
                blob, compress = _mutate_blob(rng, seeds)
                data = json.dumps({"model_key": MODEL_KEY, "compress": compress})
            else:
                data, _ = _mutate_envelope(rng)
                blob = rng.choice(seeds)[0]
            files = {"blob": ("request", blob, "application/octet-stream")}
            if rng.random() < 0.03:
                files = {"other": ("x", blob)}  # no blob part at all
            response = client.post(
                f"{fuzz_server.url}/request", data={"data": data}, files=files, headers=HEADERS
            )
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (response.status_code, response.text[:500])
            if response.status_code == 200:
                jobs.append(response.json()["id"])
            sent += 1
        assert sum(statuses.values()) == CASES

        # Every accepted job ends; a worker that died was replaced.
        outcomes: dict[str, int] = {}
        deaths = 0
        kinds: set = set()
        deadline = time.monotonic() + 180
        pending = list(jobs)
        while pending and time.monotonic() < deadline:
            still = []
            for job_id in pending:
                latest = _final(client, fuzz_server, job_id)
                if latest.get("status") in ("COMPLETED", "ERROR"):
                    outcomes[latest["status"]] = outcomes.get(latest["status"], 0) + 1
                    description = latest.get("description") or ""
                    deaths += "worker process stopped" in description
                    if latest["status"] == "ERROR":
                        kinds.add(description.split(":")[0])
                    assert "nnhost/execution" not in description, description
                else:
                    still.append(job_id)
            pending = still
            if pending:
                time.sleep(0.5)
        assert not pending, f"{len(pending)} jobs never finished"
    print(f"fuzz: {sent} requests in {time.monotonic() - started:.0f}s {statuses}; "
          f"jobs {outcomes}; worker deaths {deaths}")
    print(f"fuzz: {len(kinds)} distinct kinds of refusal")

    fuzz_server.wait_running(180)
    with remote_model.trace(PROMPT, remote=fuzz_server.url):
        remote = remote_model.lm_head.output.save()
    with local_model.trace(PROMPT):
        local = local_model.lm_head.output.save()
    assert_same(remote, local)

"""A job with a PEFT adapter gets that adapter's two files, and nothing else of the cache.

The server opens the adapter's files from its model cache and hands the job's
process the open descriptors (`execution.handoff`). A job that has beaten the
Python layer (raw Python, as in `test_isolation`) holds those descriptors
before the adapter is applied: it can read the adapter (its own request's),
but where the descriptors came from, the rest of the cache, the base model's
files, another adapter, must stay out of its reach.
"""

from __future__ import annotations

import json
import textwrap

import httpx
from conftest import API_KEY, TEST_REPO

from nnhost.execution.job.process import TEST_MAGIC, TEST_SEPARATOR

from .beaten_python import PRELUDE, reported, wait_for
from .helpers import MODEL_KEY, headers_for, serialized_request

ADAPTER = "nnhost-test/tiny-gpt2-lora"

SNOOP = """
import os
hub = {hub!r}
found = {{"fds": len(spec.adapter_fds), "heads": [], "reached": []}}
for fd in spec.adapter_fds:
    found["heads"].append(os.pread(fd, 2, 0).decode("latin-1"))
    where = os.readlink(f"/proc/self/fd/{{fd}}")
    for path in (os.path.dirname(where), os.path.join(os.path.dirname(where), "..", ".."),
                 hub, os.path.join(hub, "models--nnhost-test--tiny-gpt2")):
        try:
            found["reached"].append([path, sorted(os.listdir(path))])
        except OSError:
            pass
    for path in (os.path.join(os.path.dirname(where), "..", "..", "refs", "main"),):
        try:
            found["reached"].append([path, open(path).read()])
        except OSError:
            pass
report(found)
"""


def test_an_adapter_job_reaches_only_the_adapters_two_files(iso_server, server_hf_home, test_snapshot, remote_model):
    from nnhost.models.tiny_lora import build_tiny_lora

    build_tiny_lora(ADAPTER, test_snapshot, TEST_REPO, server_hf_home)
    source = PRELUDE + textwrap.dedent(SNOOP.format(hub=str(server_hf_home / "hub")))
    blob = TEST_MAGIC + source.encode() + TEST_SEPARATOR + serialized_request(remote_model)
    envelope = {"model_key": MODEL_KEY, "compress": False,
                "env": {"peft": ADAPTER, "attn_implementation": remote_model.attn_implementation}}
    response = httpx.post(
        f"{iso_server.url}/request",
        data={"data": json.dumps(envelope)},
        files={"blob": ("request", blob, "application/octet-stream")},
        headers=headers_for(iso_server),
        timeout=30,
    )
    assert response.status_code == 200, response.text
    found = reported(wait_for(iso_server, API_KEY, response.json()["id"]))
    assert found["fds"] == 2
    # Its own adapter: readable (a JSON config, and a safetensors header's length).
    assert found["heads"][0] == "{\n"
    assert found["reached"] == [], found["reached"]

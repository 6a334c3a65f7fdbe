"""The runtimes of clients before 0.8 read their own payload format, and hold it to the same rules.

nnsight 0.6 and 0.7 pickle a whole ``RequestModel``: their model wrapper by
value, their block as a function shipped as source (`execution.unpickling.legacy`).
Each hostile request here is what a real client of that version serializes
(`legacy_payloads.py`, run with that client's own nnsight): a payload that
calls ``os.system`` while it is read, ships source that imports ``os``,
fills the globals of a server function, names a transformers loader or calls
one, hands a server function in as its block, or has the server call a
private method of the model. Each ends as an ERROR that names what was
refused, and the next request of that version is still served, equal to
the same client's local run.

Then the Python layer is taken as beaten (the ``unsafe_test_hooks`` prefix,
an operator setting no request can turn on): raw Python in a job process
of each such runtime finds its own version's nnsight, no secret of the
server, no server data, no network and no file it may write outside its
scratch space.
"""

from __future__ import annotations

import io
import os
import subprocess
import textwrap
from pathlib import Path

import httpx
import pytest
import torch
from compare import assert_same
from conftest import API_KEY, TEST_REPO

from nnhost.client_versions import socketio_era
from nnhost.execution.job.process import TEST_MAGIC, TEST_SEPARATOR
from nnhost.runtimes import RUNTIME_VERSIONS, installed
from nnhost.testing import ServerProcess

from .beaten_python import PRELUDE, reported, wait_for
from .conftest import SECRET

LEGACY_VERSIONS = [version for version in RUNTIME_VERSIONS if socketio_era(version)]
MODEL_KEY = 'nnsight.modeling.language.LanguageModel:{"repo_id": "%s", "revision": null}' % TEST_REPO
HOSTILE = {
    "calls_os_system": "posix.system",
    "ships_source_that_imports_os": "importing 'os' is not allowed",
    "fills_a_server_function": "globals for a function the request did not ship",
    "names_a_transformers_loader": "transformers.utils.hub.cached_file",
    "calls_a_model_loader": "which this server does not accept in a request",
    "runs_a_server_function_as_its_block": "not a function it shipped as source",
    "traces_a_private_method": "a trace of the model's method '_apply'",
}
PWNED = Path("/tmp/nnhost-legacy-pwned")


@pytest.fixture(scope="module")
def legacy_server(root, server_hf_home, test_snapshot):
    missing = [version for version in LEGACY_VERSIONS if version not in installed()]
    if missing:
        pytest.fail(f"no runtime for nnsight {', '.join(missing)}: run `make install`", pytrace=False)
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / "legacy-secure-data",
        hf_home=server_hf_home,
        api_key=API_KEY,
        extra_args=["--time-limit", "20", "--kill-grace", "2"],
        env={"NNHOST_UNSAFE_TEST_HOOKS": "true", "NNHOST_TEST_SECRET": SECRET},
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module", params=LEGACY_VERSIONS)
def payloads(request, tmp_path_factory, test_snapshot):
    """The payloads a client of this version sends (`legacy_payloads.py`), by case."""
    from test_client_versions import client_python

    version = request.param
    folder = tmp_path_factory.mktemp(f"legacy-{version}")
    done = subprocess.run(
        [str(client_python(version)), str(Path(__file__).with_name("legacy_payloads.py")),
         str(test_snapshot), str(folder)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"},
    )
    assert "WROTE" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    return version, folder


def submit(server: ServerProcess, version: str, blob: bytes) -> dict:
    """POST ``blob`` as a client of ``version`` does (the whole body, settings in headers); the final status."""
    response = httpx.post(
        f"{server.url}/request", content=blob, timeout=30,
        headers={"ndif-api-key": API_KEY, "nnsight-version": version, "nnsight-model-key": MODEL_KEY,
                 "nnsight-compress": "False", "content-type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    final = wait_for(server, API_KEY, response.json()["id"], timeout=120)
    final["id"] = response.json()["id"]
    return final


def assert_still_served(server: ServerProcess, version: str, folder: Path) -> None:
    final = submit(server, version, (folder / "normal.bin").read_bytes())
    assert final["status"] == "COMPLETED", final
    download = httpx.get(final["data"], timeout=30)
    assert download.status_code == 200
    remote = torch.load(io.BytesIO(download.content), map_location="cpu", weights_only=False)
    assert_same(remote, torch.load(folder / "normal-local.pt", weights_only=False))


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_payload_of_an_older_client_is_refused_as_it_is_read(legacy_server, payloads, case):
    version, folder = payloads
    PWNED.unlink(missing_ok=True)
    final = submit(legacy_server, version, (folder / f"{case}.bin").read_bytes())
    assert final["status"] == "ERROR", final
    assert HOSTILE[case] in final["description"], final["description"]
    assert not PWNED.exists()
    assert_still_served(legacy_server, version, folder)


BEATEN = textwrap.dedent(
    """
    import socket, sys
    facts = {"nnsight": sys.modules["nnsight"].__file__}
    facts["secret"] = any(%(secret)r in value for value in _os.environ.values())
    try:
        with open(%(database)r, "rb") as file:
            facts["database"] = "read " + repr(file.read(16))
    except OSError as error:
        facts["database"] = type(error).__name__
    try:
        socket.create_connection(("127.0.0.1", %(port)d), timeout=3).close()
        facts["network"] = "connected"
    except OSError as error:
        facts["network"] = type(error).__name__
    try:
        with open(%(outside)r, "w") as file:
            file.write("pwned")
        facts["write"] = "written"
    except OSError as error:
        facts["write"] = type(error).__name__
    report(facts)
    """
)


def test_a_beaten_python_layer_in_an_older_clients_job_still_meets_the_os_layers(legacy_server, payloads):
    version, folder = payloads
    outside = legacy_server.data_dir / "pwned-by-a-job"
    source = BEATEN % {"secret": SECRET, "database": str(legacy_server.data_dir / "nnhost.sqlite3"),
                       "port": int(legacy_server.url.rsplit(":", 1)[1]), "outside": str(outside)}
    blob = TEST_MAGIC + (PRELUDE + source).encode() + TEST_SEPARATOR + (folder / "normal.bin").read_bytes()
    facts = reported(submit(legacy_server, version, blob))
    assert f"nnhost-runtimes/nnsight-{version}/" in facts["nnsight"], facts  # that runtime's own job process
    assert facts["secret"] is False, facts
    assert not facts["database"].startswith("read"), facts
    assert facts["network"] != "connected", facts
    assert facts["write"] != "written" and not outside.exists(), facts
    assert_still_served(legacy_server, version, folder)


def test_every_case_is_a_payload_the_script_writes():
    script = Path(__file__).with_name("legacy_payloads.py").read_text()
    assert [case for case in HOSTILE if f'capture("{case}"' not in script] == []

"""One contained nnhost server shared by the escape suite, with tight limits.

Its limits are small so that the hostile cases finish quickly: a short time
limit, a 2 MiB result cap, 1.5 GiB of memory per job, a 4 MiB request cap. A
secret is put in the server's environment for the exfiltration cases to look
for. Every case ends by checking that a normal request still gives the same
values as the same code run locally.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from conftest import API_KEY, TEST_REPO

from nnhost.client_versions import own_version, socketio_era
from nnhost.runtimes import RUNTIME_VERSIONS, installed
from nnhost.testing import ServerProcess

OWN = own_version()

MiB = 1024 * 1024
SECURE_TIME_LIMIT = 5
SECURE_KILL_GRACE = 2
MAX_RESULT_BYTES = 2 * MiB
MAX_REQUEST_BYTES = 4 * MiB
JOB_MEMORY_BYTES = 1536 * MiB
SECRET = "nnhost-secret-" + secrets.token_hex(8)
ISO_SECRET = "nnhost-iso-secret-" + secrets.token_hex(8)


#: Every case runs against both execution designs (see `test_execution_designs`), with
#: the server's own nnsight, and in the default design against each runtime of another
#: version that speaks the same protocol (`nnhost.runtimes`): its requests name that
#: version, so its job processes are that runtime's, forked from its template. The
#: runtimes of clients before 0.8 read another format: `test_legacy_payloads`.
SERVERS = [("fork", OWN), ("mapped", OWN),
           *(("fork", version) for version in RUNTIME_VERSIONS if not socketio_era(version))]
IDS = [f"{design}-{version}" for design, version in SERVERS]


def _with_runtime(process: ServerProcess, version: str) -> ServerProcess:
    """``process``, whose raw requests name nnsight ``version`` (`helpers.headers_for`)."""
    if version != OWN and version not in installed():
        pytest.fail(f"no runtime for nnsight {version}: run `make install`", pytrace=False)
    process.client_version = version  # type: ignore[attr-defined]
    return process


@pytest.fixture(scope="session", params=SERVERS, ids=IDS)
def secure_server(request, root, server_hf_home, test_snapshot):
    design, version = request.param
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / f"secure-data-{design}-{version}",
        hf_home=server_hf_home,
        api_key=API_KEY,
        extra_args=[
            "--time-limit", str(SECURE_TIME_LIMIT), "--kill-grace", str(SECURE_KILL_GRACE),
        ],
        env={
            "NNHOST_MAX_RESULT_BYTES": str(MAX_RESULT_BYTES),
            "NNHOST_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
            "NNHOST_JOB_MEMORY_BYTES": str(JOB_MEMORY_BYTES),
            "NNHOST_TEST_SECRET": SECRET,
            "NNHOST_EXECUTION": design,
        },
    )
    _with_runtime(process, version).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def local_reference(local_model):
    from .helpers import normal_program

    return normal_program(local_model, False)


@pytest.fixture
def serving(secure_server, remote_model, local_reference):
    """After the case: the server is (back) up and a normal request gives correct values."""
    yield secure_server
    from .helpers import assert_serving

    assert_serving(secure_server, remote_model, local_reference)


@pytest.fixture(scope="session", params=SERVERS, ids=IDS)
def iso_server(request, root, server_hf_home, test_snapshot):
    design, version = request.param
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / f"isolation-data-{design}-{version}",
        hf_home=server_hf_home,
        api_key=API_KEY,
        extra_args=["--time-limit", "6", "--kill-grace", "2"],
        env={
            "NNHOST_UNSAFE_TEST_HOOKS": "true",
            "NNHOST_JOB_MEMORY_BYTES": str(512 * MiB),
            "NNHOST_SCRATCH_BYTES": str(64 * MiB),
            "NNHOST_TEST_SECRET": ISO_SECRET,
            "NNHOST_EXECUTION": design,
        },
    )
    _with_runtime(process, version).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def mallory(iso_server) -> str:
    """A second user: the hostile one. The admin is the next user, through the client."""
    made = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "keys", "create", "--email", "mallory@example.org",
         "--data-dir", str(iso_server.data_dir)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HF_HOME": str(iso_server.hf_home)},
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


@pytest.fixture
def next_user_is_served(iso_server, remote_model, local_reference):
    yield iso_server
    from .helpers import assert_serving

    assert_serving(iso_server, remote_model, local_reference)

"""Shared fixtures: a small test model, a real nnhost server, and the nnsight client.

The client side is set up the way a user's laptop would be: ``NDIF_HOST`` and
``NDIF_API_KEY`` name the server, ``HF_ENDPOINT`` points at the server's Hub
mirror, and ``HF_HOME`` is an empty folder, so the client builds its meta model
from what the server serves, with no Hub id cache prefill. These variables are
read when nnsight and huggingface_hub are imported, hence set here, before any
test module imports them.

Results are compared with the same code run locally against the same weights,
loaded straight from the server's cache folder.

Every test is marked with its tiers (`unit`, `e2e`, `services`, `browser`,
`security`) at collection, from what it starts: see tests/tiers.py.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from tiers import COLLECTED_TIERS, tiers_of

from nnhost.testing import ServerProcess, free_port, point_client_at

TEST_REPO = "nnhost-test/tiny-gpt2"
API_KEY = "nnh_test_" + "k" * 40
#: Short, so the time-limit tests are quick; every other test runs in well under it.
TIME_LIMIT = 8
KILL_GRACE = 3

_ROOT = Path(tempfile.mkdtemp(prefix="nnhost-tests-"))
_PORT = free_port()
SERVER_URL = f"http://127.0.0.1:{_PORT}"

point_client_at(SERVER_URL, API_KEY, _ROOT)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_ROOT, ignore_errors=True)


@pytest.fixture(scope="session")
def root() -> Path:
    return _ROOT


@pytest.fixture(scope="session")
def server_hf_home() -> Path:
    return _ROOT / "server-hf"


@pytest.fixture(scope="session")
def test_snapshot(server_hf_home) -> Path:
    from nnhost.models.tiny import build_tiny_gpt2

    return build_tiny_gpt2(TEST_REPO, hf_home=server_hf_home)


@pytest.fixture(scope="session")
def server(root, server_hf_home, test_snapshot):
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / "server-data",
        hf_home=server_hf_home,
        api_key=API_KEY,
        port=_PORT,
        extra_args=["--time-limit", str(TIME_LIMIT), "--kill-grace", str(KILL_GRACE)],
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def remote_model(server):
    """The model as a user builds it: a meta model, described by the server's Hub mirror."""
    import warnings

    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LanguageModel(TEST_REPO)


@pytest.fixture(scope="session")
def local_model(test_snapshot):
    """The same weights loaded in this process, for the local side of each comparison."""
    import warnings

    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LanguageModel(str(test_snapshot), dispatch=True)
    for parameter in model._module.parameters():
        parameter.requires_grad_(False)
    return model


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of the suite's own (tests/services.py); skipped where there is none.

    In CI (``CI`` set) a PostgreSQL that cannot start fails the tests that need it instead.
    """
    import os

    from services import Postgres, Unavailable

    server = Postgres()
    try:
        server.start()
    except Unavailable as problem:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required in CI: {problem}")
        pytest.skip(f"no PostgreSQL: {problem}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path) -> str:
    """A new, empty database of each kind the server supports."""
    if request.param == "sqlite":
        from nnhost.db import sqlite_url

        return sqlite_url(tmp_path / "nnhost.sqlite3")
    return request.getfixturevalue("postgres").new_database()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these markers
def pytest_collection_modifyitems(session, config, items):
    """Mark every test with its tiers (tests/tiers.py): `make check` runs ``-m unit``."""
    collected = config.stash.setdefault(COLLECTED_TIERS, {})
    for item in items:
        tiers = tiers_of(item)
        collected[item.nodeid] = tiers
        for tier in sorted(tiers):
            if not item.get_closest_marker(tier):
                item.add_marker(getattr(pytest.mark, tier))


def sleeping_payload(model, prompt: str, sleep: float) -> bytes:
    """A real client payload (serialized by nnsight) that sleeps, then saves the last logits."""
    import time

    from nnsight.schema.request import RequestModel
    from nnsight.tracing.backend import Backend

    class Capture(Backend):
        def __call__(self, tracer):
            self.blob = RequestModel.serialize(tracer, False)

    capture = Capture()
    with model.trace(prompt, backend=capture):
        time.sleep(sleep)
        logits = model.lm_head.output[:, -1].save()  # noqa: F841 (saved by its name)
    return capture.blob

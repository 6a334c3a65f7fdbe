"""Parity: every program in `parity_programs` gives remotely what it gives locally.

Each program runs through the real nnsight client against a running server
and against the same weights in this process, and the saved values must be
identical in type at every nesting level and equal in contents
(`compare.assert_identical`). A completed program's statuses must carry no
notice about changes to the shared model: none of these programs changes it.

Fresh and warm workers: libraries import parts of themselves on first use
(numpy's ``_methods`` on the first ``.mean()``), so a program could work after
another one and fail on its own. Each job runs in a process forked from the
replica's host, so what one job imports is gone for the next; what a job finds
is what the host loaded (it preloads the usual lazy submodules and runs one
request of its own). The programs run twice against a server of their own:
the ``fresh`` pass goes first, in list order, on a host that has run nothing
but its warm-up; the ``warm`` pass repeats every one after all of them ran, so
a job that leaked state into the host would show as a difference.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from compare import assert_identical
from conftest import API_KEY, TEST_REPO
from parity_programs import PROGRAMS
from nnhost.testing import ServerProcess

NOTICE = "shared model"


@pytest.fixture(scope="module")
def parity_server(root, server_hf_home, test_snapshot):
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / "parity-server-data",
        hf_home=server_hf_home,
        api_key=API_KEY,
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def remote_logging():
    from nnsight import CONFIG

    previous = CONFIG.APP.REMOTE_LOGGING
    CONFIG.APP.REMOTE_LOGGING = True
    yield
    CONFIG.APP.REMOTE_LOGGING = previous


def run_remote(program, model, url):
    """The program's saves, and what the client printed of the job's statuses."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = program(model, url)
    return result, printed.getvalue()


def check(program, parity_server, remote_model, local_model):
    remote, statuses = run_remote(program, remote_model, parity_server.url)
    assert "Completed in" in statuses, f"the client showed no final description:\n{statuses}"
    assert NOTICE not in statuses, f"a false notice about the shared model:\n{statuses}"
    local = program(local_model, False)
    assert_identical(remote, local)


IDS = [name for name, _ in PROGRAMS]


# Defined first, so pytest runs every fresh case before any warm one.
@pytest.mark.parametrize("name,program", PROGRAMS, ids=IDS)
def test_fresh_worker(name, program, parity_server, remote_model, local_model, remote_logging):
    check(program, parity_server, remote_model, local_model)


@pytest.mark.parametrize("name,program", PROGRAMS, ids=IDS)
def test_warm_worker(name, program, parity_server, remote_model, local_model, remote_logging):
    check(program, parity_server, remote_model, local_model)

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
import re

import pytest
from compare import assert_identical
from conftest import API_KEY, TEST_REPO
from parity_programs import PROGRAMS, PROMPT, user_classes

from nnhost.testing import ServerProcess

NOTICE = "shared model"


@pytest.fixture(scope="module", params=["fork", "mapped"])
def parity_server(request, root, server_hf_home, test_snapshot):
    """A server of the programs' own, in each execution design (see `test_execution_designs`)."""
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / f"parity-server-data-{request.param}",
        hf_home=server_hf_home,
        api_key=API_KEY,
        env={"NNHOST_EXECUTION": request.param},
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


# --- a user's own exception ------------------------------------------------------------


def raise_in_the_block(model, remote):
    user = user_classes()
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].mlp.output
        if hidden.shape[-1] > 8:
            raise user.ProbeError(f"layer width {hidden.shape[-1]} is out of range")
        out = hidden.save()


def raise_in_a_shipped_helper(model, remote):
    user = user_classes()
    with model.trace(PROMPT, remote=remote):
        hidden = user.check_width(model.transformer.h[1].mlp.output, 8)
        out = hidden.save()


@pytest.mark.parametrize("program", [raise_in_the_block, raise_in_a_shipped_helper])
def test_user_exception_reaches_the_client(program, parity_server, remote_model, local_model):
    """The user's exception class, message and own lines, as the local run shows them."""
    import traceback

    from nnsight.intervention.backends.remote import RemoteError

    with pytest.raises(Exception) as local:
        program(local_model, False)
    with pytest.raises(RemoteError) as remote:
        program(remote_model, parity_server.url)
    message = str(remote.value)
    expected = traceback.format_exception_only(type(local.value), local.value)[-1].strip()
    assert expected.startswith("nnhost_parity_classes.ProbeError: "), expected
    assert message.splitlines()[-1] == expected, message
    users_frames = [
        frame
        for frame in traceback.extract_tb(local.value.__traceback__)
        if (frame.filename == __file__ and frame.name == program.__name__)
        or "nnhost_parity_classes" in frame.filename
    ]
    # The first is the client's own ``with`` line, where the local exception
    # surfaces; every frame inside the trace must be in the remote traceback,
    # with its line (nnsight re-renders the block's source, quotes may differ).
    assert users_frames[0].line.startswith("with model.trace"), users_frames[0]
    inside = users_frames[1:]
    assert inside
    for frame in inside:
        assert re.search(rf'line {frame.lineno}, in {frame.name}\n', message), (frame, message)
        assert frame.line.replace('"', "'") in message.replace('"', "'"), (frame, message)
    assert "nnhost/execution" not in message and "site-packages" not in message

"""A job process that never gets ready makes its replica unhealthy, logged, instead of a job waiting for ever.

On an H200 the mapped design's first job waited five minutes with nothing in
any log: its process never said it was ready. Here the template, which forks
every job's process, is stopped (SIGSTOP): the job already forked runs, the
next one is never made. Within ``job_start_timeout`` the replica says so, the
server log shows what the waiting process was doing, and the next request
brings the model back and is served.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from conftest import API_KEY, TEST_REPO
from process_tree import descendants, processes, serving_hosts, templates_of

from nnhost.testing import ServerProcess

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the mapped design is Linux's")

TIMEOUT = 3


@pytest.fixture(scope="module")
def impatient_server(root, server_hf_home, test_snapshot):
    process = ServerProcess(
        [TEST_REPO], data_dir=root / "job-start-timeout-data", hf_home=server_hf_home, api_key=API_KEY,
        env={"NNHOST_EXECUTION": "mapped", "NNHOST_JOB_START_TIMEOUT": str(TIMEOUT)},
    )
    process.start()
    yield process
    process.stop()


def program(model, remote):
    with model.trace("The Eiffel Tower is in the city of", remote=remote):
        out = model.lm_head.output.save()
    return out


def test_a_stuck_job_process_is_reported_and_the_model_comes_back(impatient_server, remote_model, local_model):
    import torch

    server = impatient_server
    server.wait_running(60)
    table = processes()
    templates = templates_of(table, serving_hosts(table, descendants(server.process.pid, table)))
    assert len(templates) == 1, templates
    # Let the first job process be forked and ready before the template stops.
    deadline = time.monotonic() + 30
    while not descendants(templates[0], processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(templates[0], signal.SIGSTOP)
    try:
        # The ready process serves this one; the template is asked for the next.
        assert torch.equal(program(remote_model, server.url), program(local_model, False))
        deadline = time.monotonic() + TIMEOUT + 30
        while "No job process was ready" not in server.log_tail(400) and time.monotonic() < deadline:
            time.sleep(0.2)
        log = server.log_tail(400)
        assert f"No job process was ready {TIMEOUT} s after it was asked for" in log, log[-3000:]
        # What the stopped worker was doing: its threads, stopped ("T").
        assert "made no job process" in log and f"child pid {templates[0]} " in log, log[-3000:]
        assert " T wchan" in log, log[-3000:]
    finally:
        try:
            os.kill(templates[0], signal.SIGCONT)
        except ProcessLookupError:
            pass
    # The next request brings the model back on fresh processes.
    assert torch.equal(program(remote_model, server.url), program(local_model, False))
    table = processes()
    assert templates[0] not in templates_of(table, serving_hosts(table, descendants(server.process.pid, table)))

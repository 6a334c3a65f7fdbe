"""The two execution designs on the CPU: fork (jobs forked from the host) and mapped.

In the mapped design the host, which holds the weights, forks nothing; a
template process that never holds them forks each job's process, which maps
the host's weights by handle. The parity programs and the security suite run
against both designs (`test_parity`, `tests/security`); this module checks
what only the mapped design promises: where user code runs, and who holds
the weights.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
from conftest import API_KEY, TEST_REPO
from process_tree import descendants, maps_weights, processes, serving_hosts, start_time, templates_of

from nnhost.testing import ServerProcess

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfds and /proc are Linux's")


@pytest.fixture(scope="module")
def mapped_server(root, server_hf_home, test_snapshot):
    process = ServerProcess(
        [TEST_REPO], data_dir=root / "mapped-designs-data", hf_home=server_hf_home, api_key=API_KEY,
        env={"NNHOST_EXECUTION": "mapped"},
    )
    process.start()
    yield process
    process.stop()


def _job_maps_weights(pid: int, within: float = 60.0) -> "bool | None":
    """Whether a job's process maps the weights once it has bound them; None if it ended first.

    A process just forked for the next job binds them only after its own
    namespaces and /proc (a GPU's driver starts nowhere else), so a look in
    that instant sees none yet: wait for the binding, not for the fork.
    """
    deadline = time.monotonic() + within
    while True:
        try:
            if maps_weights(pid):
                return True
        except OSError:
            return None
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def test_status_names_each_deployments_design(mapped_server, server):
    def design(process):
        deployment = process.status()["deployments"][TEST_REPO]
        return deployment["containment"]["execution"]

    assert design(mapped_server) == "mapped"
    assert design(server) == "fork"


def test_no_job_runs_in_the_process_that_holds_the_weights(mapped_server, remote_model, local_model):
    """The host maps the weights and has one child, the template; the jobs are the template's."""
    import threading

    import torch
    from nnsight import LanguageModel  # noqa: F401  (the client is imported by the fixtures)

    seen: dict = {}

    def watch():
        # While a job is running: look at the whole tree under the server.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "table" not in seen:
            table = processes()
            tree = descendants(mapped_server.process.pid, table)
            hosts = serving_hosts(table, tree)
            templates = templates_of(table, hosts)
            if hosts and templates:
                jobs = descendants(templates[0], table)
                if jobs:
                    seen.update(table=table, host=hosts[0], template=templates[0], jobs=jobs)
                    seen["host maps"] = maps_weights(hosts[0])
                    seen["template maps"] = maps_weights(templates[0])
                    seen["jobs map"] = [m for m in map(_job_maps_weights, jobs) if m is not None]
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()

    def program(model, remote):
        with model.trace("The Eiffel Tower is in the city of", remote=remote):
            out = model.lm_head.output.save()
        return out

    remote = program(remote_model, mapped_server.url)
    watcher.join()
    assert torch.equal(remote, program(local_model, False))
    assert seen, "no job process was found under the template"
    table = seen["table"]
    # The host's only child is the template: it never forked a job's process.
    assert [p for p, (parent, _) in table.items() if parent == seen["host"]] == [seen["template"]]
    assert table[seen["template"]][0] == seen["host"]
    # The host and every job's process map the weights; the template never does.
    assert seen["host maps"] and not seen["template maps"]
    assert all(seen["jobs map"]) and seen["jobs map"]


def test_a_dead_template_is_replaced_and_the_model_serves_again(mapped_server, remote_model, local_model):
    import signal

    import torch

    def templates() -> set[tuple[int, int]]:
        """The serving host's templates, each as (pid, start time): a pid alone may be reused."""
        table = processes()
        tree = descendants(mapped_server.process.pid, table)
        found = set()
        for pid in templates_of(table, serving_hosts(table, tree)):
            try:
                found.add((pid, start_time(pid)))
            except (OSError, ValueError, IndexError):
                pass  # it ended while we looked
        return found

    mapped_server.wait_running(60)
    first = templates()
    assert len(first) == 1
    os.kill(next(iter(first))[0], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not templates() - first:
        time.sleep(0.2)
    if not templates() - first:
        table = processes()
        tree = {pid: table[pid] for pid in descendants(mapped_server.process.pid, table)}
        log = mapped_server.log_path.read_text(errors="replace")[-6000:]
        raise AssertionError(f"no new template was started.\nProcesses: {tree}\n"
                             f"Status: {mapped_server.status()}\nServer log:\n{log}")
    mapped_server.wait_running(120)

    def program(model, remote):
        with model.trace("The Eiffel Tower is in the city of", remote=remote):
            out = model.transformer.h[1].output.save()
        return out

    assert torch.equal(program(remote_model, mapped_server.url), program(local_model, False))


def test_a_cold_start_takes_a_prepared_spare_host(mapped_server, remote_model, local_model):
    """After an evict, the request's deploy uses the spare (which held no model) and a new spare is made."""
    import httpx
    import torch

    def hosts():
        table = processes()
        tree = descendants(mapped_server.process.pid, table)
        every = [p for p in tree if "nnhost.execution.host.host" in table[p][1]]
        return every, serving_hosts(table, tree)

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(hosts()[0]) < 2:
        time.sleep(0.2)
    every, serving = hosts()
    spares = set(every) - set(serving)
    assert len(spares) == 1, (every, serving)
    answer = httpx.post(f"{mapped_server.url}/admin/evict", json={"model": TEST_REPO},
                        headers={"ndif-api-key": API_KEY}, timeout=30)
    assert answer.status_code == 200, answer.text

    def program(model, remote):
        with model.trace("The Eiffel Tower is in the city of", remote=remote):
            out = model.lm_head.output.save()
        return out

    assert torch.equal(program(remote_model, mapped_server.url), program(local_model, False))
    _, serving = hosts()
    assert serving == list(spares), "the deploy did not use the prepared spare"
    while time.monotonic() < deadline and len(hosts()[0]) < 2:
        time.sleep(0.2)
    assert len(hosts()[0]) == 2, "no new spare was prepared"

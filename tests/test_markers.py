"""The tier markers tests/conftest.py gives each test (tests/tiers.py), from what it starts.

`make check` runs the `unit` tier only, so a test that starts a server but is
marked `unit` would slow the fast loop, and a test with no tier would run in
no tier at all. The samples below are compiled from text, so that this
module's own tests name no server and stay `unit` themselves.
"""

from __future__ import annotations

import pytest
from tiers import COLLECTED_TIERS, TIERS, starts

#: Tests whose tiers are known, as the whole suite collects them.
KNOWN = {
    "tests/test_units.py::test_fair_queue_round_robins_users_and_keeps_each_users_order": {"unit"},
    "tests/test_units.py::test_lifecycle_refuses_impossible_histories[sqlite]": {"unit"},
    # The same test on PostgreSQL: the database fixture asks for the server by its parameter.
    "tests/test_units.py::test_lifecycle_refuses_impossible_histories[postgresql]": {"services"},
    "tests/test_service_inprocess.py::test_cancel_a_queued_and_a_running_job": {"unit"},
    # Through the session's `server` fixture, a `ServerProcess`.
    "tests/test_remote.py::test_interventions_set_and_modify_outputs": {"e2e"},
    # Through a helper of the module that runs `nnhost.cli` in a child Python.
    "tests/test_accounts.py::test_invite_only_signup": {"e2e"},
    "tests/test_gpu_check.py::test_the_whole_check_runs_on_the_cpu_with_a_small_model": {"e2e"},
    "tests/test_browser.py::test_sign_up_make_a_key_use_it_see_the_job_and_revoke_it": {"browser", "e2e"},
    "tests/test_browser.py::test_pages_refuse_framing_and_inline_script": {"e2e"},
    "tests/test_front_end.py::test_the_client_works_through_the_guides_site": {"e2e", "services"},
    "tests/test_ray_replicas.py::test_jobs_run_on_a_ray_node_with_local_results": {"e2e", "services"},
    "tests/security/test_guard_and_rules.py::test_guard_undoes_what_a_job_changed": {"security"},
    "tests/security/test_escapes.py::test_no_connection_reaches_a_loopback_listener[fork-0.8.1]": {"security", "e2e"},
    "tests/security/test_escapes.py::test_the_cases_cover_the_issue": {"security"},
}

SAMPLES = '''
import subprocess
import sys

from moto_s3 import S3Endpoint
from nnhost.testing import ServerProcess


def pure():
    return sorted([3, 1, 2])


def server():
    return ServerProcess(["org/model"])


def calls_a_helper():
    return helper()


def helper():
    return S3Endpoint()


def child_python():
    return subprocess.run([sys.executable, "-c", "pass"])


class Answering(ServerProcess):
    pass


class Uses:
    def start(self):
        return calls_a_helper()


def asks(request):
    return request.getfixturevalue("postgres")


def imports_a_helper():
    from kinds import run_client  # a child Python, in a module of tests/

    return run_client


def through_a_module():
    import kinds

    return kinds.run_client
'''


@pytest.fixture(scope="module")
def samples() -> dict:
    # Compiled as if in this file, so that `starts` follows their calls as it does the suite's.
    namespace: dict = {"__name__": "tier_samples"}
    exec(compile(SAMPLES, __file__, "exec"), namespace)
    return namespace


#: Each sample's tiers and the fixtures it asks for by name.
SAMPLE_STARTS = {
    "pure": (set(), set()),
    "server": ({"e2e"}, set()),
    "calls_a_helper": ({"services"}, set()),
    "child_python": ({"e2e"}, set()),
    "Answering": ({"e2e"}, set()),
    "Uses": ({"services"}, set()),
    "asks": (set(), {"postgres"}),
    "imports_a_helper": ({"e2e"}, set()),
    "through_a_module": ({"e2e"}, set()),
}


@pytest.mark.parametrize("name", SAMPLE_STARTS)
def test_what_code_starts_is_found_through_its_helpers(samples, name):
    assert starts(samples[name]) == SAMPLE_STARTS[name]


def test_every_collected_test_has_a_tier_and_unit_only_alone(request):
    collected = request.config.stash[COLLECTED_TIERS]
    assert request.node.nodeid in collected
    for nodeid, tiers in collected.items():
        assert tiers and tiers <= set(TIERS), nodeid
        assert "unit" not in tiers or tiers == {"unit"}, nodeid
    for item in request.session.items:
        assert any(item.get_closest_marker(tier) for tier in TIERS), item.nodeid


def test_known_tests_have_their_tiers(request):
    collected = request.config.stash[COLLECTED_TIERS]
    files = {nodeid.split("::")[0] for nodeid in collected}
    known = {nodeid: tiers for nodeid, tiers in KNOWN.items() if nodeid.split("::")[0] in files}
    if not known:
        pytest.skip("none of the known tests' files was collected: run the whole suite or `make check`")
    for nodeid, tiers in known.items():
        assert nodeid in collected, f"{nodeid} is gone: update KNOWN in {__file__}"
        assert collected[nodeid] == tiers, nodeid

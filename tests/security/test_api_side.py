"""The API side's own defences, against real servers: throttling, proxies, log floods.

- Failed keys slow further failures from that address, never a valid key:
  30+ guesses from one address, then the right key from it still works.
- ``X-Forwarded-For`` is believed only from proxies the operator names: from
  loopback it is ignored by default (so it cannot dodge the throttle) and
  honoured once loopback is named with ``--forwarded-allow-ips``.
- A job printing 100 MB leaves at most ``max_log_bytes`` of it in the
  database, the client sees the notice, and the next request is correct.

(The checks of single forged worker events drive the job service directly:
tests/test_job_events.py.)
"""

from __future__ import annotations

import sqlite3

import httpx
import pytest
from conftest import API_KEY, TEST_REPO

from nnhost.testing import ServerProcess

from .helpers import assert_serving

NOWHERE = f"/response/{'0' * 32}"  # any route that needs a key; 404 once the key is good


def ask(server, key, forwarded=None):
    headers = {"ndif-api-key": key}
    if forwarded:
        headers["X-Forwarded-For"] = forwarded
    return httpx.get(server.url + NOWHERE, headers=headers, timeout=10)


@pytest.fixture(scope="module")
def plain_server(root, server_hf_home, test_snapshot):
    process = ServerProcess(
        [TEST_REPO], data_dir=root / "api-side-plain", hf_home=server_hf_home, api_key=API_KEY
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def proxied_server(root, server_hf_home, test_snapshot):
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / "api-side-proxied",
        hf_home=server_hf_home,
        api_key=API_KEY,
        extra_args=["--forwarded-allow-ips", "127.0.0.1"],
        env={"NNHOST_AUTH_FAILURE_LIMIT": "3"},
    )
    process.start()
    yield process
    process.stop()


class TestThrottleNeverLocksOutAValidKey:
    def test_thirty_guesses_then_the_right_key_from_the_same_address(self, plain_server):
        codes = [ask(plain_server, f"nnh_guess_{i}").status_code for i in range(35)]
        assert codes[:30] == [403] * 30 and set(codes[30:]) == {429}
        refused = ask(plain_server, "nnh_guess_more")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        # The right key from the very same address is served at once.
        assert ask(plain_server, API_KEY).status_code == 404
        whoami = httpx.get(
            plain_server.url + "/whoami", headers={"ndif-api-key": API_KEY}, timeout=10
        )
        assert whoami.json()["email"] == "admin@localhost"

    def test_forwarded_for_from_loopback_is_ignored_by_default(self, plain_server):
        # Runs after the guesses above: loopback is over its limit. Claiming to be
        # another address through a header nobody vouches for changes nothing.
        refused = ask(plain_server, "nnh_guess_disguised", forwarded="203.0.113.7")
        assert refused.status_code == 429
        assert ask(plain_server, API_KEY, forwarded="203.0.113.7").status_code == 404

    def test_forwarded_for_is_honoured_from_a_named_proxy(self, proxied_server):
        codes = [ask(proxied_server, f"nnh_x{i}", forwarded="198.51.100.1").status_code
                 for i in range(4)]
        assert codes == [403, 403, 403, 429]
        # Another client behind the same proxy is its own source ...
        assert ask(proxied_server, "nnh_y", forwarded="198.51.100.2").status_code == 403
        # ... and the throttled one still gets in with its right key.
        assert ask(proxied_server, API_KEY, forwarded="198.51.100.1").status_code == 404


class TestLogFlood:
    def test_a_hundred_megabytes_of_prints_leave_at_most_the_cap(
        self, plain_server, remote_model, local_reference, capfd
    ):
        line = "z" * 8000
        with remote_model.trace("The Eiffel Tower is in the city of", remote=plain_server.url):
            for _ in range(100_000_000 // 8000):
                print(line)
            logits = remote_model.lm_head.output.save()
        assert logits.shape[0] == 1
        shown = capfd.readouterr().out
        assert "Output past this point was dropped" in shown

        database = sqlite3.connect(plain_server.data_dir / "nnhost.sqlite3")
        try:
            (job_id,) = database.execute(
                "SELECT id FROM jobs ORDER BY created_at DESC LIMIT 1"
            ).fetchone()
            lines = [row[0] for row in database.execute(
                "SELECT line FROM job_logs WHERE job_id = ? ORDER BY rowid", (job_id,)
            )]
        finally:
            database.close()
        *kept, notice = lines
        assert sum(len(text.encode()) for text in kept) <= 1024 * 1024
        assert kept and set(kept) == {line}
        assert "dropped" in notice
        assert_serving(plain_server, remote_model, local_reference)

"""The deployment guide's nginx site in front of a real server: what uvicorn leaves to it.

uvicorn does not bound how long a client may take to send a request's head,
nor how many connections one address holds; docs/security.md says the front end
does, and the guide's site is the config it points to. These tests run that
site as written (only the listen address, TLS and upstream changed, see
`service_nginx`) and show that the unmodified nnsight client works through it,
that a request head that never ends is cut off, and that one address cannot
hold more than its share of connections while another is still served.
Bounded in count and time; loopback only.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time

import pytest
from conftest import API_KEY, TEST_REPO
from service_nginx import guide_site, nginx_in_front_of
from test_hostile_traffic import small_trace_works
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from nnhost.testing import ServerProcess


@pytest.fixture(scope="module")
def backend(root, server_hf_home, test_snapshot):
    process = ServerProcess(
        [TEST_REPO], data_dir=root / "front-end-data", hf_home=server_hf_home, api_key=API_KEY,
        extra_args=["--forwarded-allow-ips", "127.0.0.1"],
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def front(backend):
    nginx = nginx_in_front_of(f"127.0.0.1:{backend.port}")
    yield nginx
    nginx.stop()


def guide_value(directive: str) -> str:
    match = re.search(rf"^\s*{directive}\s+([^;]+);", guide_site(), re.M)
    assert match, f"the guide's site sets no {directive}"
    return match.group(1).strip()


def test_the_client_works_through_the_guides_site(front, remote_model, local_model):
    small_trace_works(front, remote_model, local_model)


def test_a_request_head_that_never_ends_is_cut_off(front):
    timeout = float(guide_value("client_header_timeout").rstrip("s"))
    with socket.create_connection(("127.0.0.1", front.port), timeout=timeout + 15) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: nnhost\r\nX-Slow: ")  # and nothing more
        started = time.monotonic()
        answer = b""
        while True:
            piece = sock.recv(4096)
            if not piece:
                break
            answer += piece
        waited = time.monotonic() - started
    assert waited < timeout + 10, f"the connection stayed open {waited:.0f}s"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:100]


def test_one_address_holds_at_most_its_share_of_connections(front):
    share = int(guide_value("limit_conn nnhost_per_address").split()[-1])
    url = front.url.replace("http://", "ws://") + "/subscribe"
    with contextlib.ExitStack() as held:
        for _ in range(share):
            held.enter_context(connect(url, open_timeout=20))
        with pytest.raises(InvalidStatus) as refused:
            with connect(url, open_timeout=20):
                pass
        assert refused.value.response.status_code == int(guide_value("limit_conn_status"))
        # Another address is still served.
        with connect(url, open_timeout=20, source_address=("127.0.0.2", 0)) as other:
            assert "session_id" in other.recv(timeout=20)

"""A well-behaved client's latency with and without each hostile load, in one run.

One ``nnhost serve`` on its defaults (on loopback, the tiny test GPT-2), and
a well-behaved client at another loopback address measuring the median and
95th percentile of ``/ping`` and the median of a small trace through the real
nnsight client, first with nothing else going on, then while each attack
runs in the background (each bounded in count and time, loopback only)::

    .venv/bin/python benchmarks/hostile.py [--seconds 4] [--traces 8]

The attacks are the ones issue 19 measured: a login flood naming a new email
each time, request lines that never end, idle half-requests held open (and
more idle connections than the server may hold, issue 36), an anonymous huge body to an operator route, and websocket messages far past the
limit. Each row prints the figure under attack beside the quiet one and their
ratio. What it shows: the server keeps answering, not how fast it is.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from suite import REPO, Table, client_and_local, small  # noqa: E402

API_KEY = "nnh_bench_" + "h" * 40
CLIENT_ADDRESS = "127.0.0.9"
ATTACKER = "127.0.0.2"


def login_flood(url: str, stop: threading.Event) -> None:
    import re
    from concurrent.futures import ThreadPoolExecutor

    def one(index: int) -> None:
        with httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=ATTACKER),
                          timeout=30) as client:
            token = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text).group(1)
            client.post("/login", data={"email": f"flood{index}@example.org", "password": "wrong",
                                        "csrf": token})

    with ThreadPoolExecutor(32) as pool:
        for index in range(400):
            if stop.is_set():
                break
            pool.submit(one, index)


def endless_request_lines(url: str, stop: threading.Event, port: int) -> None:
    piece = b"a" * 2**20
    while not stop.is_set():
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /")
            try:
                for _ in range(96):
                    if stop.is_set():
                        break
                    sock.sendall(piece)
            except OSError:
                pass  # refused and closed: start another


def idle_half_requests(url: str, stop: threading.Event, port: int, count: int = 500) -> None:
    held = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n")
            held.append(sock)
        stop.wait()
    finally:
        for sock in held:
            sock.close()


def idle_past_the_ceiling(url: str, stop: threading.Event, port: int, count: int = 2400) -> None:
    """More idle and half-sent connections than max_connections (1000 by default), from 24 addresses."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 512 if hard == resource.RLIM_INFINITY else min(hard, count + 512)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    held = []
    try:
        for index in range(count):
            if stop.is_set():
                break
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5,
                                                source_address=(f"127.0.3.{index % 24 + 1}", 0))
                if index % 2:
                    sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n")
            except OSError:
                continue  # the server's queue was full for a moment, or this process's limit
            held.append(sock)
        stop.wait()
    finally:
        for sock in held:
            sock.close()


def anonymous_huge_bodies(url: str, stop: threading.Event, port: int) -> None:
    piece = b" " * 2**20
    while not stop.is_set():
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /admin/deploy HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 402653184\r\n\r\n")
            try:
                for _ in range(384):
                    if stop.is_set():
                        break
                    sock.sendall(piece)
            except OSError:
                pass


def big_websocket_messages(url: str, stop: threading.Event) -> None:
    import logging

    from websockets.sync.client import connect

    logging.getLogger("websockets").setLevel(logging.CRITICAL)  # each refusal is expected

    target = url.replace("http://", "ws://") + "/subscribe"
    while not stop.is_set():
        try:
            with connect(target, compression="deflate", max_size=None, open_timeout=5) as websocket:
                websocket.recv(timeout=5)
                websocket.send(b"\0" * 2**24)  # 16 MiB, deflates to almost nothing
                websocket.recv(timeout=5)
        except Exception:
            pass


def measure(url: str, remote, seconds: float, traces: int) -> tuple[float, float, float]:
    """/ping median and 95th percentile, and a small trace's median, in ms."""
    pings = []
    with httpx.Client(transport=httpx.HTTPTransport(local_address=CLIENT_ADDRESS), timeout=60) as client:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            started = time.perf_counter()
            client.get(f"{url}/ping")
            pings.append(time.perf_counter() - started)
            time.sleep(0.02)
    runs = []
    for _ in range(traces):
        started = time.perf_counter()
        small(remote, remote=True)
        runs.append(time.perf_counter() - started)
    pings.sort()
    return (statistics.median(pings) * 1e3, pings[int(0.95 * (len(pings) - 1))] * 1e3,
            statistics.median(runs) * 1e3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--traces", type=int, default=8)
    args = parser.parse_args()
    from nnhost.models.tiny import build_tiny_gpt2
    from nnhost.testing import ServerProcess, free_port, point_client_at

    root = Path(tempfile.mkdtemp(prefix="nnhost-bench-hostile-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    point_client_at(url, API_KEY, root)
    hf_home = root / "server-hf"
    snapshot = build_tiny_gpt2(REPO, hf_home=hf_home)
    server = ServerProcess([REPO], data_dir=root / "data", hf_home=hf_home, api_key=API_KEY, port=port)
    server.start()
    table = Table()
    try:
        remote, local = client_and_local(snapshot)
        for _ in range(3):  # warm: the first requests import on both sides
            small(remote, remote=True)
        quiet = measure(url, remote, args.seconds, args.traces)
        print(f"quiet: /ping {quiet[0]:.1f} ms (p95 {quiet[1]:.1f}), small trace {quiet[2]:.1f} ms", flush=True)
        attacks: dict[str, Callable[[threading.Event], None]] = {
            "login flood, new email each": lambda stop: login_flood(url, stop),
            "request lines with no end": lambda stop: endless_request_lines(url, stop, port),
            "500 idle half-requests": lambda stop: idle_half_requests(url, stop, port),
            "2,400 idle connections, past max_connections": lambda stop: idle_past_the_ceiling(url, stop, port),
            "anonymous 384 MiB bodies": lambda stop: anonymous_huge_bodies(url, stop, port),
            "16 MiB websocket messages": lambda stop: big_websocket_messages(url, stop),
        }
        for name, attack in attacks.items():
            stop = threading.Event()
            thread = threading.Thread(target=attack, args=(stop,), daemon=True)
            thread.start()
            time.sleep(0.5)  # let it get going
            try:
                under = measure(url, remote, args.seconds, args.traces)
            finally:
                stop.set()
                thread.join(timeout=60)
            print(name, flush=True)
            table.add(name, "/ping median", under[0], "quiet", quiet[0], "ms")
            table.add(name, "/ping p95", under[1], "quiet", quiet[1], "ms")
            table.add(name, "small trace median", under[2], "quiet", quiet[2], "ms")
            assert httpx.get(f"{url}/ping", timeout=30).status_code == 200, "the server stopped answering"
    finally:
        server.stop()
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real Redis for the tests: Debian's redis-server, on loopback, started and stopped by PID.

`make install` installs the package when it is missing (as root with apt). In
CI a missing redis-server fails the tests that need it; elsewhere they skip,
with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from nnhost.testing import free_port

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisProcess:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nnhost-redis-"))
        self.port = free_port()
        self.process = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "no", "--protected-mode", "yes", "--daemonize", "no"],
            stdout=open(self.dir / "redis.log", "wb"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as probe:
                    probe.sendall(b"PING\r\n")
                    if probe.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start: {(self.dir / 'redis.log').read_text()}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server():
    if not (os.path.isfile(REDIS) and os.access(REDIS, os.X_OK)):
        message = "these tests need redis-server; `make install` installs it (apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    server = RedisProcess()
    yield server
    server.stop()

"""The deployment guide's nginx site, run in front of a test server: Debian's nginx, by PID.

The site is read from ``docs/deploying.md`` (its ``nginx`` block, as an
operator would copy it) and changed only where a test must: it listens on a
free loopback port without TLS, and its upstream is the test server. Every
limit in it is the guide's. `make install` installs the package when it is
missing (as root with apt); in CI a missing nginx fails the tests that need
it, elsewhere they skip, with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from nnhost.testing import free_port

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
GUIDE = Path(__file__).resolve().parents[1] / "docs" / "deploying.md"


def guide_site() -> str:
    """The nginx block of the deployment guide, as written there."""
    blocks = re.findall(r"```nginx\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "the deployment guide should hold exactly one nginx site"
    return blocks[0]


def site_for_test(site: str, port: int, upstream: str) -> str:
    """The guide's site on ``127.0.0.1:port`` without TLS, in front of ``upstream`` (host:port)."""
    site = re.sub(r"listen 443 ssl;", f"listen 127.0.0.1:{port};", site)
    site = re.sub(r"\n\s*ssl_certificate(_key)?\s[^\n]*;", "", site)
    site = re.sub(r"(upstream nnhost_api \{)[^}]*\}", rf"\1\n    server {upstream};\n}}", site)
    assert f"listen 127.0.0.1:{port};" in site and upstream in site and "ssl" not in site
    return site


class NginxProcess:
    def __init__(self, upstream: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nnhost-nginx-"))
        self.port = free_port()
        temp = {name: self.dir / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
        for path in temp.values():
            path.mkdir()
        config = f"""
            worker_processes 1;
            pid {self.dir / "nginx.pid"};
            error_log {self.dir / "error.log"} info;
            events {{ worker_connections 1024; }}
            http {{
                access_log off;
                client_body_temp_path {temp["body"]};
                proxy_temp_path {temp["proxy"]};
                fastcgi_temp_path {temp["fastcgi"]};
                uwsgi_temp_path {temp["uwsgi"]};
                scgi_temp_path {temp["scgi"]};
                {site_for_test(guide_site(), self.port, upstream)}
            }}
        """
        (self.dir / "nginx.conf").write_text(config)
        self.process = subprocess.Popen(
            [NGINX, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=open(self.dir / "stderr.log", "wb"),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx did not start: {self.log()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return "".join(
            (self.dir / name).read_text(errors="replace")
            for name in ("stderr.log", "error.log") if (self.dir / name).exists()
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # nginx's fast shutdown; its workers go with the master
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def nginx_in_front_of(upstream: str):
    """A started `NginxProcess`, or the skip (or, in CI, the failure) saying what is missing."""
    if not (os.path.isfile(NGINX) and os.access(NGINX, os.X_OK)):
        message = "these tests need nginx; `make install` installs it (apt-get install nginx-light)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return NginxProcess(upstream)

"""Services the suite starts for itself: PostgreSQL, on loopback, in a temporary directory.

`Postgres` runs Debian's own ``initdb`` and ``postgres`` (installed by ``make
install``) as an unprivileged user, since PostgreSQL refuses to run as root: the
system user ``nnhost-pg``, made when missing. It listens on 127.0.0.1 only, on a
free port, with its socket in its own directory, requires a password (a random
one per run), and is stopped by its PID. Each test that wants a database of its
own gets one from `Postgres.new_database`.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

from nnhost.testing import free_port

SYSTEM_USER = "nnhost-pg"
SUPERUSER = "nnhost"


class Unavailable(RuntimeError):
    """PostgreSQL cannot be started here; the message says why."""


def _binaries() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for directory in candidates:
        if all(os.access(Path(directory) / name, os.X_OK) for name in ("initdb", "postgres")):
            return Path(directory)
    raise Unavailable(
        "PostgreSQL is not installed (no initdb/postgres in /usr/lib/postgresql/*/bin or on "
        "PATH); `make install` as root installs Debian's postgresql package"
    )


def _account() -> Optional[pwd.struct_passwd]:
    """Who PostgreSQL runs as: nobody special when we are not root, else the system user."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        pass
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER],
        capture_output=True, text=True,
    )
    if made.returncode != 0 and "already exists" not in made.stderr:
        raise Unavailable(f"cannot make the system user {SYSTEM_USER}: {made.stderr.strip()}")
    return pwd.getpwnam(SYSTEM_USER)


class Postgres:
    def __init__(self) -> None:
        self.root: Optional[Path] = None
        self.process: Optional[subprocess.Popen] = None
        self.port = 0
        self.password = secrets.token_hex(16)
        self._names = itertools.count()

    def _as_user(self) -> dict:
        if self.account is None:
            return {}
        return {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}

    def start(self, timeout: float = 60.0) -> "Postgres":
        binaries = _binaries()
        self.account = _account()
        self.root = Path(tempfile.mkdtemp(prefix="nnhost-pg-"))
        data, sockets = self.root / "data", self.root / "run"
        sockets.mkdir()
        password_file = self.root / "password"
        password_file.write_text(self.password + "\n")
        if self.account is not None:
            for path in (self.root, sockets, password_file):
                os.chown(path, self.account.pw_uid, self.account.pw_gid)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(self.root)}
        made = subprocess.run(
            [str(binaries / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=scram-sha-256",
             f"--pwfile={password_file}", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
            capture_output=True, text=True, env=env, cwd=self.root, **self._as_user(),
        )
        if made.returncode != 0:
            raise Unavailable(f"initdb failed: {made.stderr.strip() or made.stdout.strip()}")
        self.port = free_port()
        self.log_path = self.root / "postgres.log"
        log = open(self.log_path, "ab")
        if self.account is not None:
            os.chown(self.log_path, self.account.pw_uid, self.account.pw_gid)
        self.process = subprocess.Popen(
            [str(binaries / "postgres"), "-D", str(data), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-k", str(sockets),
             # A throwaway cluster: durability is not what the tests are about.
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             # Each test's stores hold a small pool of their own.
             "-c", "max_connections=300"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
            start_new_session=True, **self._as_user(),
        )
        log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise Unavailable(f"postgres exited at start:\n{self.log_tail()}")
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise Unavailable(f"postgres did not accept connections:\n{self.log_tail()}") from None
                time.sleep(0.1)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = f"test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.dsn(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)  # "fast" shutdown: ends sessions, exits
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=10)
            self.process = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

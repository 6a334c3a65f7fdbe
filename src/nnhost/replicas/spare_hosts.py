"""Host processes started before any model needs them, so that a cold start skips the imports.

Most of a cold start is not loading the weights: it is starting Python and
importing torch, transformers and nnsight (seconds, against tens of
milliseconds to load a small model). A spare host has done all of that
(`execution.host.host.prepare`: the server's worker environment applied, its
namespaces entered, the libraries and the allowed modules imported, and in
the mapped design its template started and prepared too) and waits for the
one message that names its model. A replica that starts takes a spare that
was prepared for the same environment, if one is ready, and the pool starts
another in the background.

Spares are started from one long-lived thread: a host dies with the thread
that started it (``PR_SET_PDEATHSIG``), and it must outlive none of the
server. It never sends a spare anything but its model's options, and never
reads what one writes.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from typing import Optional

from ..execution.channel import Channel, pair
from ..execution.messages import Prepare

Started = tuple["subprocess.Popen[bytes]", Channel]


def start_host(env: dict[str, str], environ: dict[str, str]) -> Started:
    """Start a host with a clean environment and prepare it for ``environ`` (the worker's)."""
    ours, theirs = pair()
    host = subprocess.Popen(
        [sys.executable, "-m", "nnhost.execution.host.host", str(theirs.fileno())],
        pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL, close_fds=True,
    )
    theirs.close()
    control = Channel(ours)
    control.send(Prepare(environ=environ))
    return host, control


class SpareHosts:
    """Prepared hosts, by the environment they were prepared for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[str, list[Started]] = {}
        self._wanted: "queue.Queue[tuple[dict[str, str], dict[str, str], int]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None

    @staticmethod
    def _key(env: dict[str, str], environ: dict[str, str]) -> str:
        return json.dumps([env, environ], sort_keys=True)

    def take(self, env: dict[str, str], environ: dict[str, str]) -> Optional[Started]:
        """A live spare prepared for exactly this environment, or None."""
        with self._lock:
            spares = self._ready.get(self._key(env, environ), [])
            while spares:
                host, control = spares.pop(0)
                if host.poll() is None:
                    return host, control
                control.close()
        return None

    def keep(self, env: dict[str, str], environ: dict[str, str], count: int) -> None:
        """Have ``count`` spares ready for this environment (started in the background)."""
        if count <= 0:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._starter, name="spare-hosts", daemon=True)
                self._thread.start()
        self._wanted.put((dict(env), dict(environ), count))

    def _starter(self) -> None:
        while True:
            env, environ, count = self._wanted.get()
            key = self._key(env, environ)
            with self._lock:
                missing = count - sum(1 for host, _ in self._ready.get(key, []) if host.poll() is None)
            for _ in range(max(0, missing)):
                try:
                    started = start_host(env, environ)
                except OSError:
                    break
                with self._lock:
                    self._ready.setdefault(key, []).append(started)

    def close(self) -> None:
        with self._lock:
            spares = [started for group in self._ready.values() for started in group]
            self._ready.clear()
        for host, control in spares:
            control.close()
            try:
                host.wait(timeout=5)  # a spare ends when its channel closes
            except subprocess.TimeoutExpired:
                host.kill()
                host.wait()


#: The spares of this process (the server's, or a Ray node's replica actor's).
SPARES = SpareHosts()


def clean_environment(keys: tuple[str, ...]) -> dict[str, str]:
    return {key: os.environ[key] for key in keys if key in os.environ}

"""Running a real nnhost server in a subprocess, for tests and benchmarks.

`ServerProcess` starts ``nnhost serve`` on a free loopback port with its own
data directory, waits until every deployment reports RUNNING, and stops it by
PID. Tests and benchmarks drive it with the real nnsight client, so what they
measure is what a user gets. `RayCluster` is a real Ray cluster of a head and
worker nodes on this machine, loopback only, for the Ray replica tests and
benchmark.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import httpx


def point_client_at(server_url: str, api_key: str, root: Path) -> None:
    """Set this process up as a user's nnsight client of ``server_url``.

    ``NDIF_HOST``/``NDIF_API_KEY`` name the server; ``HF_ENDPOINT`` sends the
    Hugging Face libraries to its Hub mirror, with an empty ``HF_HOME``, as on
    a laptop that has never seen the model. nnsight and huggingface_hub read
    these when imported, so call this before importing either.
    """
    os.environ["NDIF_HOST"] = server_url
    os.environ["NDIF_API_KEY"] = api_key
    os.environ["HF_ENDPOINT"] = f"{server_url}/hub"
    os.environ["HF_HOME"] = str(root / "client-hf")
    os.environ.pop("HF_HUB_OFFLINE", None)
    os.environ["NNSIGHT_CONFIG"] = str(root / "client-nnsight.yaml")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ServerProcess:
    def __init__(
        self,
        models: Sequence[str],
        *,
        data_dir: Path,
        hf_home: Path,
        api_key: str,
        extra_args: Sequence[str] = (),
        env: Optional[dict[str, str]] = None,
        log_path: Optional[Path] = None,
        port: Optional[int] = None,
        descriptors: Optional[int] = None,
    ) -> None:
        self.models = list(models)
        self.data_dir = Path(data_dir)
        self.hf_home = Path(hf_home)
        self.api_key = api_key
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.port = port or free_port()
        #: The server's descriptor limit (soft and hard), where a test lowers it.
        self.descriptors = descriptors
        self.log_path = log_path or self.data_dir / "server.log"
        self.process: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> "ServerProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HOME": str(self.hf_home), "HF_HUB_OFFLINE": "1", **self.env}
        command = [
            sys.executable,
            "-m",
            "nnhost.cli",
            "serve",
            *self.models,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--api-key",
            self.api_key,
            "--log-level",
            "warning",
            *self.extra_args,
        ]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=self._lower_descriptors if self.descriptors else None,
        )
        self.wait_running(timeout)
        return self

    def _lower_descriptors(self) -> None:
        import resource

        assert self.descriptors is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.descriptors, self.descriptors))

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = httpx.get(f"{self.url}/status", timeout=5).json()
        return status

    def wait_running(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"nnhost exited early; see {self.log_path}:\n{self.log_tail()}")
            try:
                states = [d["application_state"] for d in self.status()["deployments"].values()]
                # Ready when something serves and nothing is still loading (models
                # left COLD by the memory budget stay NOT_STARTED); a server that
                # serves only models fetched on demand ([[allow]]) when it answers.
                if not states or ("RUNNING" in states and "DEPLOYING" not in states):
                    return
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"nnhost did not become ready; see {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=timeout)
        self._log.close()
        self.process = None

    def user_keys(self, count: int, prefix: str = "user") -> list[str]:
        """``count`` new users of this server (on its default SQLite database), a key each."""
        from .auth.keys import KeyStore
        from .db import connect

        database = connect(self.data_dir / "nnhost.sqlite3")
        try:
            keys = KeyStore(database)
            made = []
            for _ in range(count):
                email = f"{prefix}-{os.urandom(4).hex()}@example.org"
                made.append(keys.create_key(keys.add_user(email), name=prefix))
            return made
        finally:
            database.close()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RayCluster:
    def __init__(self, workers: int = 2) -> None:
        # With this, every node's listeners stay on the loopback address it is given.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(
            initialize_head=True, connect=False,
            head_node_args={"node_ip_address": "127.0.0.1", "num_cpus": 0, "include_dashboard": False},
        )
        self.workers = [self.cluster.add_node(node_ip_address="127.0.0.1", num_cpus=1)
                        for _ in range(workers)]

    @property
    def address(self) -> str:
        address: str = self.cluster.address
        return address

    def node(self, node_id: str) -> Any:
        return next(node for node in self.workers if node.node_id == node_id)

    def remove(self, node: Any) -> None:
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)

    def shutdown(self) -> None:
        self.cluster.shutdown()

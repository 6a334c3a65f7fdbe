"""The Ray path against the local one: per-request overhead, and one replica against two.

One run starts a Ray cluster of two worker nodes on this machine (loopback,
`nnhost.testing.RayCluster`), then, one after the other, three real servers of
the small test model: local worker processes (no Ray), ``--cluster`` with one
replica, and ``--cluster`` with two replicas (one on each node). It prints the
median client latency of a small trace on the Ray path beside the local path,
and jobs per second with ``--clients`` client processes for one replica beside
two, every remote result checked against a local run::

    .venv/bin/python benchmarks/ray_path.py [--repeats 30] [--clients 4] [--seconds 15]

On a 2-core machine both Ray nodes share the same two cores, so two replicas
show what the placement costs, not what a second machine would add.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_clients import ClientPool  # noqa: E402
from suite import REPO, Table, check_same, client_and_local, small, timed  # noqa: E402

API_KEY = "nnh_bench_" + "r" * 40


def latency(remote, local, url: str, repeats: int) -> float:
    from nnsight.intervention.backends.remote import RemoteBackend

    expected = small(local)
    for _ in range(3):
        small(remote, backend=RemoteBackend(remote.to_model_key(), host=url))
    times = []
    for _ in range(repeats):
        backend = RemoteBackend(remote.to_model_key(), host=url)
        elapsed, logits = timed(lambda backend=backend: small(remote, backend=backend))
        check_same(logits, expected, "ray path")
        times.append(elapsed * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    from nnhost.testing import RayCluster, ServerProcess, free_port, point_client_at

    root = Path(tempfile.mkdtemp(prefix="nnhost-bench-ray-"))
    port = free_port()
    point_client_at(f"http://127.0.0.1:{port}", API_KEY, root)
    from nnhost.models.tiny import build_tiny_gpt2

    hf_home = root / "server-hf"
    snapshot = build_tiny_gpt2(REPO, hf_home=hf_home)
    cluster = RayCluster(workers=2)
    table = Table()
    pool = None
    try:
        def serve(name: str, extra: list, toml: str = "") -> ServerProcess:
            data = root / name
            data.mkdir()
            if toml:
                (data / "nnhost.toml").write_text(toml)
            return ServerProcess([] if toml else [REPO], data_dir=data, hf_home=hf_home,
                                 api_key=API_KEY, port=port, extra_args=extra).start(timeout=300)

        figures = {}
        server = serve("local", [])
        remote, local = client_and_local(snapshot)
        expected = small(local).detach()
        pool = ClientPool(args.clients, REPO)
        try:
            figures["local"] = latency(remote, local, server.url, args.repeats)
        finally:
            server.stop()
        for replicas in (1, 2):
            toml = f'[[model]]\nrepo_id = "{REPO}"\nreplicas = {replicas}\n'
            server = serve(f"ray-{replicas}", ["--cluster", cluster.address], toml)
            try:
                if replicas == 1:
                    figures["ray"] = latency(remote, local, server.url, args.repeats)
                figures[f"rate {replicas}"] = pool.rate(server.url, args.clients, args.seconds, expected)
            finally:
                server.stop()
        table.add("ray", "small trace, median, Ray path", figures["ray"],
                  "local worker path", figures["local"], "ms")
        table.add("ray", f"{args.clients} clients, two replicas on two nodes", figures["rate 2"],
                  "one replica", figures["rate 1"], "jobs/s")
        table.print()
    finally:
        if pool is not None:
            pool.close()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

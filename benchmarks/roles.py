"""Separate API and controller processes against one process: overhead, throughput, takeover.

One run starts the suite's own PostgreSQL and Redis on loopback
(tests/services.py, tests/service_redis.py) and, one after the other, a
single ``--role all`` server (SQLite, in-process bus) and a split one: two
``--role api`` processes behind a small load balancer and one ``--role
controller`` with a standby, all on PostgreSQL and Redis. It prints the
median client latency of a small trace through each, jobs per second with
``--clients`` client processes through each, and how long after a SIGKILL
of the acting controller the standby completes a job, every remote result
checked against a local run::

    .venv/bin/python benchmarks/roles.py [--repeats 30] [--clients 4] [--seconds 10]

What the split costs per request is the controller finding a new job in the
database (it looks every 50 ms) and updates crossing Redis; on a 2-core
machine every process shares the same cores.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from bench_clients import ClientPool  # noqa: E402
from ray_path import latency  # noqa: E402
from suite import REPO, Table, check_same, client_and_local, small  # noqa: E402

API_KEY = "nnh_bench_" + "s" * 40


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    from balancer import Balancer
    from service_redis import RedisProcess
    from services import Postgres

    from nnhost.models.tiny import build_tiny_gpt2
    from nnhost.testing import ServerProcess, free_port, point_client_at

    root = Path(tempfile.mkdtemp(prefix="nnhost-bench-roles-"))
    front_port = free_port()
    point_client_at(f"http://127.0.0.1:{front_port}", API_KEY, root)
    hf_home = root / "server-hf"
    snapshot = build_tiny_gpt2(REPO, hf_home=hf_home)
    postgres, redis = Postgres().start(), RedisProcess()
    table, started, pool = Table(), [], None
    try:
        from nnsight.intervention.backends.remote import RemoteBackend

        def serve(name: str, extra: list, port=None) -> ServerProcess:
            process = ServerProcess([REPO], data_dir=root / name, hf_home=hf_home, api_key=API_KEY,
                                    port=port, extra_args=extra)
            started.append(process)
            return process.start(timeout=300)

        figures = {}
        single = serve("all", [], port=front_port)
        remote, local = client_and_local(snapshot)
        expected = small(local).detach()
        pool = ClientPool(args.clients, REPO)
        figures["all"] = latency(remote, local, single.url, args.repeats)
        figures["all rate"] = pool.rate(single.url, args.clients, args.seconds, expected)
        single.stop()

        shared = ["--database", postgres.new_database(), "--events", redis.url,
                  "--results", str(root / "shared-results")]
        controller = serve("controller-a", ["--role", "controller", *shared])
        apis = [serve(f"api-{i}", ["--role", "api", *shared]) for i in (1, 2)]
        balancer = Balancer([api.port for api in apis], lambda head: hash(head) % 2)
        figures["split"] = latency(remote, local, balancer.url, args.repeats)
        figures["split rate"] = pool.rate(balancer.url, args.clients, args.seconds, expected)

        serve("controller-b", ["--role", "controller", *shared])
        controller.stop(signal.SIGKILL)
        killed = time.monotonic()
        backend = RemoteBackend(remote.to_model_key(), host=apis[0].url)
        check_same(small(remote, backend=backend), expected, "after the takeover")
        figures["takeover"] = time.monotonic() - killed
        balancer.stop()

        table.add("roles", "small trace, median, api + controller", figures["split"],
                  "one process", figures["all"], "ms")
        table.add("roles", f"{args.clients} clients, two API processes", figures["split rate"],
                  "one process", figures["all rate"], "jobs/s")
        table.add("roles", "SIGKILL to a completed job (standby)", figures["takeover"],
                  "", None, "s")
        table.print()
    finally:
        if pool is not None:
            pool.close()
        for process in reversed(started):
            process.stop()
        redis.stop()
        postgres.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

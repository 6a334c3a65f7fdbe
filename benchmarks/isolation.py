"""What does a fresh process per job cost, in each execution design? Against one trusted process.

Run it as::

    .venv/bin/python benchmarks/isolation.py [--repeats N] [--jobs N] [--models tiny,gpt2] [--levels N]

For each model (the tiny test model, and a GPT-2-small-shaped random model of
~124M parameters) one run starts three real ``nnhost serve`` processes: the
**fork** design (each job in a fresh, contained process forked ahead of time
from the host that holds the sealed weights), the **mapped** design
(``execution = "mapped"``: each job's process forked from a template without
weights, mapping the host's by handle) and ``containment = false`` (trusted
mode: one long-lived process runs every job). Run as root, so that every layer
applies (the first line per server says which are active).

Printed per model and server:

* **latency**: the real nnsight client's wall time for a small trace (save the
  last position's logits), median and p90, the two servers interleaved;
* **worker ms**: the job's own ``meta["total_seconds"]`` (read, run, write);
* **1 user / 8 users**: jobs per second with 8 clients posting the same
  serialized trace over raw HTTP and polling ``/response`` (8 threads of one
  key, then 8 keys of 8 users), so the client's own tracing is not counted;

and the ratios of each design to trusted, and of mapped to fork (goal: mapped
within 10% of fork on latency and throughput).

Then, for each contained design and the first model, **levels**: the client's
time to result of the small trace with the model HOT, WARM (loaded in host
memory) and COLD (deployed by the request), ``--levels`` rounds, beside the
plain load time of the same model in this process (``LanguageModel(...,
dispatch=True)``). Goal: COLD at most 0.5 s above the plain load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Optional

from common import PROMPT, client_models, timed_trace

API_KEY = "nnh_bench_" + "i" * 40
WARMUP = 3


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round((len(ordered) - 1) * q / 100)))]


def serialized(model) -> bytes:
    from nnsight.schema.request import RequestModel

    class Capture:
        blob = b""

        def __call__(self, tracer):
            Capture.blob = RequestModel.serialize(tracer, False)

    with model.trace(PROMPT, backend=Capture()):
        model.lm_head.output[:, -1].save()
    return Capture.blob


def throughput(url: str, model_key: str, blob: bytes, keys: list, jobs: int) -> float:
    import httpx

    done = []
    lock = threading.Lock()
    remaining = [jobs]

    def client(key: str) -> None:
        headers = {"ndif-api-key": key, "nnsight-version": "0.8.1"}
        with httpx.Client(timeout=60) as http:
            while True:
                with lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                reply = http.post(f"{url}/request", headers=headers,
                                  data={"data": json.dumps({"model_key": model_key, "compress": False})},
                                  files={"blob": ("request", blob, "application/octet-stream")})
                job_id = reply.json()["id"]
                while True:
                    status = http.get(f"{url}/response/{job_id}", headers=headers).json()["status"]
                    if status in ("COMPLETED", "ERROR"):
                        with lock:
                            done.append(status)
                        break
                    time.sleep(0.01)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(keys[i % len(keys)],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    assert done.count("COMPLETED") == jobs, done
    return jobs / elapsed


def new_key(server, email: str) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "keys", "create", "--email", email, "--data-dir", str(server.data_dir)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HF_HOME": str(server.hf_home)},
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


def bench_model(kind: str, repo: str, snapshot: Path, servers: dict, repeats: int, jobs: int) -> dict:
    import torch

    names = list(servers)
    urls = {name: server.url for name, server in servers.items()}
    remote, _, expected = client_models(repo, snapshot)
    for name in names:
        _, logits, _ = timed_trace(remote, urls[name])
        # Thread counts differ between a job and this process: float sums round differently.
        assert torch.allclose(logits, expected, rtol=1e-4, atol=1e-5), (name, float((logits - expected).abs().max()))
        for _ in range(WARMUP):
            timed_trace(remote, urls[name])
    latency = {name: [] for name in names}
    worker = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            elapsed, _, meta = timed_trace(remote, urls[name])
            latency[name].append(elapsed * 1000)
            worker[name].append(meta.get("total_seconds", float("nan")) * 1000)
    blob = serialized(remote)
    result = {}
    for name in names:
        keys = servers[name].user_keys
        result[name] = {
            "median": statistics.median(latency[name]),
            "p90": percentile(latency[name], 90),
            "worker": statistics.median(worker[name]),
            "one user": throughput(urls[name], remote.to_model_key(), blob, [API_KEY], jobs),
            "eight users": throughput(urls[name], remote.to_model_key(), blob, keys, jobs),
        }
    return result


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed traces per server")
    parser.add_argument("--jobs", type=int, default=48, help="jobs per throughput run")
    parser.add_argument("--models", default="tiny,gpt2")
    parser.add_argument("--torch-threads", type=int, default=0, help="threads per job (every server)")
    parser.add_argument("--levels", type=int, default=3, help="rounds of HOT/WARM/COLD per design (0: none)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="nnhost-bench-isolation-"))
    from nnhost.testing import ServerProcess, free_port, point_client_at

    names = tuple(DESIGNS)
    ports = {name: free_port() for name in names}
    # Before anything imports huggingface_hub: the client's Hub is the first server's mirror.
    point_client_at(f"http://127.0.0.1:{ports[names[0]]}", API_KEY, root)
    from nnhost.models.tiny import TinyGPT2Spec, build_tiny_gpt2

    shapes = {"tiny": TinyGPT2Spec(),
              "gpt2": TinyGPT2Spec(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50256)}
    kinds = args.models.split(",")
    hf_home = root / "server-hf"
    snapshots = {}
    for kind in kinds:
        print(f"building nnhost-bench/isolation-{kind} ...", flush=True)
        snapshots[kind] = build_tiny_gpt2(f"nnhost-bench/isolation-{kind}", hf_home=hf_home, spec=shapes[kind])
    servers = {}
    try:
        for name in names:
            env = DESIGNS[name]
            servers[name] = ServerProcess([f"nnhost-bench/isolation-{k}" for k in kinds],
                                          data_dir=root / name, hf_home=hf_home,
                                          api_key=API_KEY, port=ports[name], env=env,
                                          extra_args=["--torch-threads", str(args.torch_threads)]).start()
            servers[name].user_keys = [new_key(servers[name], f"user{i}@example.org") for i in range(8)]
            for entry in servers[name].status()["deployments"].values():
                print(f"  {name}: {entry.get('description', '')}", flush=True)
        results = {kind: bench_model(kind, f"nnhost-bench/isolation-{kind}", snapshots[kind], servers,
                                     args.repeats, args.jobs) for kind in kinds}
        levels = {}
        if args.levels > 0:
            repo = f"nnhost-bench/isolation-{kinds[0]}"
            for name in ("fork-per-job", "mapped"):
                levels[name] = bench_levels(servers[name], repo, snapshots[kinds[0]], args.levels)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"{'model':<6} {'server':<13} {'median ms':>10} {'p90 ms':>8} {'worker ms':>10} "
          f"{'1 user job/s':>13} {'8 users job/s':>14}")
    for kind, result in results.items():
        for name, row in result.items():
            print(f"{kind:<6} {name:<13} {row['median']:>10.1f} {row['p90']:>8.1f} {row['worker']:>10.2f} "
                  f"{row['one user']:>13.1f} {row['eight users']:>14.1f}")
        for label, top, bottom in (("fork/trusted", "fork-per-job", "trusted"),
                                   ("mapped/trust", "mapped", "trusted"),
                                   ("mapped/fork", "mapped", "fork-per-job")):
            a, b = result[top], result[bottom]
            print(f"{kind:<6} {label:<13} {a['median'] / b['median']:>9.3f}x "
                  f"{a['p90'] / b['p90']:>7.3f}x {a['worker'] / b['worker']:>9.3f}x "
                  f"{a['one user'] / b['one user']:>12.3f}x {a['eight users'] / b['eight users']:>13.3f}x"
                  f"   (median {a['median'] - b['median']:+.1f} ms)")
    if levels:
        print()
        print(f"levels ({kinds[0]} model), client seconds to result, median of {args.levels}:")
        print(f"{'design':<13} {'HOT':>7} {'WARM':>7} {'COLD':>7} {'plain load':>11} {'COLD - load':>12}")
        for name, row in levels.items():
            print(f"{name:<13} {row['HOT']:>7.3f} {row['WARM']:>7.3f} {row['COLD']:>7.3f} "
                  f"{row['load']:>11.3f} {row['COLD'] - row['load']:>+12.3f}")
    return 0


#: The servers compared: each design's environment.
DESIGNS = {
    "fork-per-job": {"NNHOST_EXECUTION": "fork"},
    "mapped": {"NNHOST_EXECUTION": "mapped"},
    "trusted": {"NNHOST_CONTAINMENT": "false"},
}


def bench_levels(server, repo: str, snapshot: Path, rounds: int) -> dict:
    """Median seconds to result with the model HOT, WARM, COLD; and the plain load here."""
    import torch
    from hotswap import Admin
    from nnsight import LanguageModel

    admin = Admin(server.url, API_KEY, repo)
    remote, _, expected = client_models(repo, snapshot)
    samples: dict = {"HOT": [], "WARM": [], "COLD": [], "load": []}

    def timed(case: str) -> None:
        time.sleep(0.5)
        elapsed, logits, _ = timed_trace(remote, server.url)
        assert torch.allclose(logits, expected, rtol=1e-5, atol=1e-6), case
        samples[case].append(elapsed)

    try:
        for _ in range(rounds):
            admin.wait("HOT", running=True, timeout=300)
            timed("HOT")
            admin.evict()
            admin.wait("COLD", running=False, timeout=300)
            timed("COLD")
            admin.wait("HOT", running=True, timeout=300)
            admin.evict()
            admin.wait("COLD", running=False, timeout=300)
            admin.deploy("warm")
            admin.wait("WARM", running=True, timeout=300)
            timed("WARM")
            time.sleep(0.5)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                started = time.perf_counter()
                LanguageModel(str(snapshot), dispatch=True)
                samples["load"].append(time.perf_counter() - started)
    finally:
        admin.close()
    return {case: statistics.median(values) for case, values in samples.items()}


if __name__ == "__main__":
    sys.exit(main())

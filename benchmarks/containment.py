"""What does containing user code cost? The same small trace, containment on and off.

Run it as::

    .venv/bin/python benchmarks/containment.py [--repeats N] [--model tiny|gpt2]

One run starts two real ``nnhost serve`` processes on the same model: one with
the defaults (restricted unpickling, import allowlist and AST check, read-only
weights and the per-job integrity check, and the OS layers: namespaces, a
dropped uid, rlimits, a scrubbed environment, freed-memory scrubbing), and one
with ``NNHOST_CONTAINMENT=false``, the operator switch for trusted deployments.
The real nnsight client sends the same small trace (save the last position's
logits) to each, interleaved so that drift on the machine hits both alike.

Printed per server: the client's median and p90 wall time for the trace, the
worker's own ``meta["total_seconds"]`` (deserialize, run, serialize, write) and
``meta["integrity_seconds"]`` (the per-job check of the shared model), and, at
the end, the ratio of the medians (contained / uncontained). ``--model gpt2``
uses a GPT-2-small-shaped random model (~124M parameters) instead of the tiny
test model, to show that the per-job cost does not grow with the weights.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

from common import client_models, timed_trace

REPO_ID = "nnhost-bench/containment-gpt2"
API_KEY = "nnh_bench_" + "c" * 40
WARMUP = 3


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round((len(ordered) - 1) * q / 100)))]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=40, help="timed traces per server")
    parser.add_argument("--model", choices=["tiny", "gpt2"], default="tiny")
    args = parser.parse_args(argv)

    from nnhost.testing import ServerProcess, free_port, point_client_at

    root = Path(tempfile.mkdtemp(prefix="nnhost-bench-containment-"))
    ports = {"contained": free_port(), "uncontained": free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    point_client_at(urls["contained"], API_KEY, root)
    servers: dict[str, ServerProcess] = {}
    try:
        from nnhost.models.tiny import TinyGPT2Spec, build_tiny_gpt2

        spec = TinyGPT2Spec()
        if args.model == "gpt2":
            spec = TinyGPT2Spec(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50256)
        hf_home = root / "server-hf"
        print(f"building {REPO_ID} ({args.model}) ...", flush=True)
        snapshot = build_tiny_gpt2(REPO_ID, hf_home=hf_home, spec=spec)
        for name, port in ports.items():
            env = {"NNHOST_CONTAINMENT": "false"} if name == "uncontained" else {}
            print(f"starting the {name} server on {urls[name]} ...", flush=True)
            servers[name] = ServerProcess(
                [REPO_ID], data_dir=root / f"{name}-data", hf_home=hf_home,
                api_key=API_KEY, port=port, env=env,
            ).start()
        for name, server in servers.items():
            entry = next(iter(server.status()["deployments"].values()))
            print(f"  {name}: {entry.get('description', '')}")

        import torch

        remote_model, _, expected = client_models(REPO_ID, snapshot)
        for name in servers:  # correctness first, then warm-up
            _, logits, _ = timed_trace(remote_model, urls[name])
            assert torch.allclose(logits, expected, rtol=1e-5, atol=1e-6), name
            for _ in range(WARMUP):
                timed_trace(remote_model, urls[name])

        times: dict[str, list] = {name: [] for name in servers}
        totals: dict[str, list] = {name: [] for name in servers}
        checks: dict[str, list] = {name: [] for name in servers}
        for _ in range(args.repeats):
            for name in servers:
                elapsed, _, meta = timed_trace(remote_model, urls[name])
                times[name].append(elapsed)
                totals[name].append(meta.get("total_seconds", float("nan")))
                checks[name].append(meta.get("integrity_seconds", 0.0))

        print()
        print(f"small trace, {args.model} model, median of {args.repeats} (after {WARMUP} warm-ups):")
        print(f"{'server':<12} {'client ms':>10} {'client p90':>11} {'worker total ms':>16} {'integrity ms':>13}")
        for name in servers:
            print(
                f"{name:<12} {statistics.median(times[name]) * 1000:>10.1f} "
                f"{percentile(times[name], 90) * 1000:>11.1f} "
                f"{statistics.median(totals[name]) * 1000:>16.2f} "
                f"{statistics.median(checks[name]) * 1000:>13.2f}"
            )
        ratio = statistics.median(times["contained"]) / statistics.median(times["uncontained"])
        worker_ratio = statistics.median(totals["contained"]) / statistics.median(totals["uncontained"])
        print()
        print(f"contained / uncontained, client median: {ratio:.3f}x")
        print(f"contained / uncontained, worker total median: {worker_ratio:.3f}x")
        return 0
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

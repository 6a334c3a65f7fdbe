"""Each client version's runtime beside the server's own: latency, throughput and memory, in one run.

One ``nnhost serve`` on its defaults (loopback, the tiny test GPT-2) serves
every client version this checkout has a runtime for (`nnhost.runtimes`;
``make install`` builds them). For each version a real client of that version
(``make clients`` builds their environments; the server's own version is
this Python) measures, side by side in the same run:

1. the median client wall time of a small trace (``--repeats``, after a warm-up);
2. jobs per second with 8 client processes at once (``--clients``), for
   ``--seconds``, each started and loaded before any window opens;
3. the server's own time per job, from its job rows (RECEIVED to COMPLETED,
   while one client traced alone), apart from what each client spends;
4. the memory the runtime holds of its own (its template and job processes'
   private pages, from ``/status``), on a second server whose model has
   GPT-2 small's shape (``--memory-width``, ``--memory-layers``), beside that
   model's weights, which the runtime maps from the host rather than copies.

Every remote result is checked against the same client's local run before
its time counts. A trace that fails in the client (an update the 0.6/0.7
clients' Socket.IO library lost or could not decode, docs/runtimes.md) is
interrupted after 30 s, counted, printed per version, and left out. The versions take turns, ``--rounds`` times, and each
figure is the median of its rounds. Each row prints the figure beside the server's own
version's and their ratio; the goal is every runtime within 10% of it::

    .venv/bin/python benchmarks/runtimes.py [--repeats 30] [--seconds 15] [--clients 8]
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
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from suite import REPO, Table  # noqa: E402

API_KEY = "nnh_bench_" + "r" * 40
#: The memory row's model: GPT-2 small's shape by default, so the weights dwarf a process.
BIG = "nnhost-bench/runtimes-wide"
CLIENTS = HERE.parent / ".clients"

CLIENT = r'''
import json, os, signal, statistics, sys, threading, time, warnings
warnings.simplefilter("ignore")
import nnsight
from nnsight import CONFIG, LanguageModel
CONFIG.APP.REMOTE_LOGGING = False
repo, snapshot = sys.argv[1], sys.argv[2]
PROMPT = "The Eiffel Tower is in the city of"
model = LanguageModel(repo)
local = LanguageModel(snapshot, dispatch=True)
with local.trace(PROMPT):
    expected = local.lm_head.output[:, -1].save()

def trace():
    with model.trace(PROMPT, remote=True):
        logits = model.lm_head.output[:, -1].save()
    if not bool((logits - expected).abs().max() < 1e-5):
        raise SystemExit("a remote result differed from the local one")

failed = 0


def guarded():
    """One trace; True if it completed. A trace whose update the client lost or could not
    decode (the 0.6/0.7 clients' Socket.IO race, docs/runtimes.md) counts as failed: one
    that waits too long is interrupted. A result that differs still ends the run."""
    global failed
    timer = threading.Timer(30.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        trace()
        return True
    except (KeyboardInterrupt, Exception):
        failed += 1
        return False
    finally:
        timer.cancel()


for _ in range(3):
    if guarded():
        break
print(json.dumps({"ready": nnsight.__version__}), flush=True)
for line in sys.stdin:  # "latency COUNT" or "rate START_AT SECONDS"
    order = line.split()
    if order[0] == "latency":
        times = []
        for _ in range(int(order[1])):
            started = time.perf_counter()
            if guarded():
                times.append(time.perf_counter() - started)
        print(json.dumps({"median": statistics.median(times), "failed": failed}), flush=True)
    else:
        start_at, seconds = float(order[1]), float(order[2])
        while time.time() < start_at:
            time.sleep(0.001)
        done, end = 0, start_at + seconds
        while time.time() < end:
            if guarded() and time.time() <= end:
                done += 1
        print(json.dumps({"done": done, "failed": failed}), flush=True)
'''


def client_python(version: str, own: str) -> str:
    if version == own:
        return sys.executable
    python = CLIENTS / f"nnsight-{version}" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no nnsight {version} client environment: run `make clients`")
    return str(python)


class Clients:
    """``count`` client processes of one nnsight version, loaded before anything is timed."""

    def __init__(self, python: str, script: Path, env: dict, snapshot: Path, count: int, version: str,
                 repo: str = REPO) -> None:
        self.processes = [subprocess.Popen([python, str(script), repo, str(snapshot)], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
                          for _ in range(count)]
        for report in self._reports(self.processes):
            if report.get("ready") != version:
                raise SystemExit(f"a client of nnsight {version} reported {report}")
        #: Each client's traces that failed in the client so far (`guarded` in CLIENT).
        self.failed = [0] * count

    @staticmethod
    def _reports(processes: list) -> list[dict]:
        reports = []
        for process in processes:
            line = process.stdout.readline()
            if not line.startswith("{"):
                raise SystemExit(f"a client failed (exit {process.poll()}): {line[-2000:]}")
            reports.append(json.loads(line))
        return reports

    def latency(self, repeats: int) -> float:
        first = self.processes[0]
        first.stdin.write(f"latency {repeats}\n")
        first.stdin.flush()
        report = self._reports([first])[0]
        self.failed[0] = report["failed"]
        return float(report["median"])

    def rate(self, seconds: float) -> float:
        start_at = time.time() + 1.0
        for process in self.processes:
            process.stdin.write(f"rate {start_at} {seconds}\n")
            process.stdin.flush()
        reports = self._reports(self.processes)
        self.failed = [report["failed"] for report in reports]
        return sum(report["done"] for report in reports) / seconds

    def close(self) -> None:
        for process in self.processes:
            process.stdin.close()
            process.wait(timeout=60)


def runtime_memory(server, version: str, deadline: float = 60.0) -> Optional[int]:
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        for entry in server.status()["deployments"].values():
            held = (entry.get("runtimes") or {}).get(version)
            if held:
                return int(held)
        time.sleep(0.5)
    return None


def server_seconds(server, windows: dict[str, list[tuple[float, float]]], own: str) -> dict[str, float]:
    """The median time from RECEIVED to COMPLETED of each version's jobs while one client traced alone.

    Read from the server's own job rows: the server's side of a trace, without
    what the client spends (a 0.6/0.7 client makes a new HTTP client for each
    POST and download, docs/benchmarks.md).
    """
    import sqlite3

    connection = sqlite3.connect(f"file:{server.data_dir / 'nnhost.sqlite3'}?mode=ro", uri=True)
    try:
        medians = {}
        for version, spans in windows.items():
            spent = [row[0] * 1000 for opened, closed in spans for row in connection.execute(
                "SELECT updated_at - created_at FROM jobs WHERE status = 'COMPLETED' AND client_version = ? "
                "AND created_at BETWEEN ? AND ?", ("" if version == own else version, opened, closed))]
            medians[version] = statistics.median(spent) if spent else float("nan")
        return medians
    finally:
        connection.close()


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per version, alternating (medians)")
    parser.add_argument("--memory-width", type=int, default=768, help="the memory row's model: its width")
    parser.add_argument("--memory-layers", type=int, default=12, help="the memory row's model: its layers")
    parser.add_argument("--execution", choices=["auto", "fork", "mapped"], default="auto",
                        help="the server's execution design (default: its own default)")
    args = parser.parse_args(argv)
    from nnhost.client_versions import own_version
    from nnhost.models.tiny import TinyGPT2Spec, build_tiny_gpt2
    from nnhost.runtimes import installed
    from nnhost.testing import ServerProcess

    own = own_version()
    versions = [own, *installed()]
    root = Path(tempfile.mkdtemp(prefix="nnhost-bench-runtimes-"))
    table = Table()
    server = None
    try:
        hf_home = root / "server-hf"
        snapshot = build_tiny_gpt2(REPO, hf_home=hf_home)
        server = ServerProcess([REPO], data_dir=root / "server", hf_home=hf_home, api_key=API_KEY,
                               env={"NNHOST_EXECUTION": args.execution}).start()
        script = root / "client.py"  # a file: nnsight reads the trace's source
        script.write_text(CLIENT)
        env = {**os.environ, "NDIF_HOST": server.url, "NDIF_API_KEY": API_KEY, "HF_ENDPOINT": f"{server.url}/hub",
               "HF_HOME": str(root / "client-hf"), "NNSIGHT_CONFIG": str(root / "nnsight.yaml"),
               "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
        print(f"{os.cpu_count()} cores; versions {', '.join(versions)}; loading {args.clients} clients of each",
              flush=True)
        pools = {version: Clients(client_python(version, own), script, env, snapshot, args.clients, version)
                 for version in versions}
        latency: dict[str, list[float]] = {version: [] for version in versions}
        rate: dict[str, list[float]] = {version: [] for version in versions}
        # Rounds alternate the versions, so that a noisy moment of the machine falls on each alike.
        windows: dict[str, list[tuple[float, float]]] = {version: [] for version in versions}
        for round_ in range(args.rounds):
            for version in versions if round_ % 2 == 0 else reversed(versions):
                opened = time.time()
                latency[version].append(pools[version].latency(args.repeats) * 1000)
                windows[version].append((opened, time.time()))
                rate[version].append(pools[version].rate(args.seconds))
        for pool in pools.values():
            pool.close()
        latency_ms = {version: statistics.median(values) for version, values in latency.items()}
        jobs = {version: statistics.median(values) for version, values in rate.items()}
        for version in versions:
            table.add("runtimes", f"small trace, nnsight {version} client", latency_ms[version],
                      f"nnsight {own} (own)", latency_ms[own], "ms")
        for version in versions:
            table.add("runtimes", f"{args.clients} clients, nnsight {version}", jobs[version],
                      f"nnsight {own} (own)", jobs[own], "jobs/s")
        served = server_seconds(server, windows, own)
        for version in versions:
            table.add("runtimes", f"server time per job, nnsight {version} (received to completed)",
                      served[version], f"nnsight {own} (own)", served[own], "ms")
        for version in versions:
            print(f"nnsight {version}: {sum(pools[version].failed)} traces failed in the client "
                  "(an update lost or not decoded, interrupted after 30 s)", flush=True)
        server.stop()
        server = None
        # The memory a runtime adds, on a model whose weights are large beside it.
        spec = TinyGPT2Spec(n_layer=args.memory_layers, n_embd=args.memory_width, n_head=12, vocab_size=4096)
        big = build_tiny_gpt2(BIG, hf_home=hf_home, spec=spec)
        server = ServerProcess([BIG], data_dir=root / "memory", hf_home=hf_home, api_key=API_KEY,
                               env={"NNHOST_EXECUTION": args.execution}).start()
        weights = sum(path.stat().st_size for path in big.glob("*.safetensors"))
        for version in versions[1:]:
            pool = Clients(client_python(version, own), script, {**env, "NDIF_HOST": server.url,
                                                                  "HF_ENDPOINT": f"{server.url}/hub"},
                           big, 1, version, repo=BIG)  # its first trace starts the runtime
            pool.close()
            held = runtime_memory(server, version)
            if held is None:
                print(f"  /status showed no memory for the nnsight {version} runtime", flush=True)
                continue
            table.add("runtimes", f"memory of the nnsight {version} runtime", held / 2**20,
                      "the model's weights", weights / 2**20, "MiB")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    table.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

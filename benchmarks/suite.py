"""The benchmark suite: nnhost measured side by side with local nnsight, one table.

Run it as ``make bench`` (or ``make bench ARGS=--quick``, the short form CI
can afford), which is::

    .venv/bin/python benchmarks/suite.py [--quick] [--json PATH]

One run builds the small random test GPT-2 into a temporary Hugging Face
cache, starts real ``nnhost serve`` processes on loopback, points the real
nnsight client at them the way a user would (``nnhost.testing.point_client_at``)
and measures, each figure beside its comparison from the same run:

1. **overhead**: the median client wall time of a small trace through the
   server against the same trace run locally, and the server's own share of
   it (the job's ``meta["total_seconds"]``: read, run and write the result);
2. **throughput** with 1, 4 and 16 concurrent client processes
   (`bench_clients.ClientPool`), jobs per second, against the rate one local
   process reaches running the same trace back to back. It runs twice: on the
   server's default thread count, and with every job given all the cores
   (``--torch-threads <cores>``, torch's own default), alternating per client
   count, so the table shows whether the default holds under load;
3. **download**: MB/s fetching a 100 MB result from ``/result`` against
   reading the same bytes back from a local file;
4. **first LOG**: seconds from entering the trace to the client receiving
   the LOG of a ``print`` at the start of a long job, against the same print
   locally;
5. **levels**: time to result of a small trace with the model COLD (deployed
   on demand), WARM and HOT (the operator endpoints move it between levels).

Every remote result is checked against the local one before its time counts.
All clients use the admin key given to ``--api-key``, which the default
limits leave unthrottled, so the figures measure the server, not its limits.
The table is printed and written as JSON (``--json``, by default
``test-output/bench.json``) with the commit, the cores and the arguments, so
two runs can be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_clients import PROMPT, ClientPool  # noqa: E402
from hotswap import Admin, check_same  # noqa: E402

REPO = "nnhost-bench/suite-tiny"
API_KEY = "nnh_bench_" + "s" * 40
RESULT_NUMEL = 25_000_000  # 100 MB of float32
ROOT = Path(__file__).resolve().parents[1]


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Table:
    """Rows of (section, measure, nnhost, comparison, unit), printed and dumped as JSON."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, section: str, measure: str, nnhost: float, against: str, comparison: Optional[float],
            unit: str) -> None:
        ratio = nnhost / comparison if comparison else None
        self.rows.append({"section": section, "measure": measure, "nnhost": nnhost,
                          "against": against, "comparison": comparison, "ratio": ratio, "unit": unit})
        print(f"  {measure}: {nnhost:.4g} {unit}"
              + (f" against {comparison:.4g} ({against}), ratio {ratio:.3f}" if comparison else ""), flush=True)

    def print(self) -> None:
        print()
        header = f"{'section':<11} {'measure':<40} {'nnhost':>10} {'compared with':<28} {'value':>10} {'ratio':>7}  unit"
        print(header)
        print("-" * len(header))
        for row in self.rows:
            comparison = f"{row['comparison']:>10.4g}" if row["comparison"] is not None else f"{'':>10}"
            ratio = f"{row['ratio']:>7.3f}" if row["ratio"] is not None else f"{'':>7}"
            print(f"{row['section']:<11} {row['measure']:<40} {row['nnhost']:>10.4g} {row['against']:<28} "
                  f"{comparison} {ratio}  {row['unit']}")


def client_and_local(snapshot: Path):
    """The model as a client builds it (described by the server's Hub mirror), and the same
    weights loaded here, frozen as the server holds them; the client's remote logging off."""
    import nnsight
    from nnsight import LanguageModel

    nnsight.CONFIG.APP.REMOTE_LOGGING = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        remote = LanguageModel(REPO)
        local = LanguageModel(str(snapshot), dispatch=True)
    for parameter in local._module.parameters():
        parameter.requires_grad_(False)
    return remote, local


def small(model, **kwargs):
    with model.trace(PROMPT, **kwargs):
        logits = model.lm_head.output[:, -1].save()
    return logits


def timed(function):
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


# -- 1. overhead ----------------------------------------------------------------------


def bench_overhead(table: Table, remote, local, url: str, repeats: int) -> None:
    from nnsight.intervention.backends.remote import RemoteBackend

    expected = small(local)
    remote_ms, local_ms, server_ms = [], [], []
    for _ in range(3):
        small(remote, backend=RemoteBackend(remote.to_model_key(), host=url))
        small(local)
    for _ in range(repeats):
        backend = RemoteBackend(remote.to_model_key(), host=url)
        elapsed, logits = timed(lambda backend=backend: small(remote, backend=backend))
        check_same(logits, expected, "overhead")
        remote_ms.append(elapsed * 1000)
        server_ms.append((backend.meta or {}).get("total_seconds", float("nan")) * 1000)
        local_ms.append(timed(lambda: small(local))[0] * 1000)
    remote_median, local_median = statistics.median(remote_ms), statistics.median(local_ms)
    table.add("overhead", "small trace, median", remote_median, "local trace", local_median, "ms")
    table.add("overhead", "server's own share (meta total)", statistics.median(server_ms),
              "client-observed remote", remote_median, "ms")


# -- 2. throughput ----------------------------------------------------------------------


def local_rate(local, seconds: float) -> float:
    end, done = time.perf_counter() + seconds, 0
    started = time.perf_counter()
    while time.perf_counter() < end:
        small(local)
        done += 1
    return done / (time.perf_counter() - started)


def bench_throughput(table: Table, pool: ClientPool, servers: dict, local, counts: list, seconds: float,
                     expected) -> None:
    baseline = local_rate(local, seconds)
    table.add("throughput", "local, one process", baseline, "", None, "jobs/s")
    for count in counts:
        for name, server in servers.items():
            rate = pool.rate(server.url, count, seconds, expected)
            table.add("throughput", f"{count} clients, {name}", rate, "local, one process", baseline, "jobs/s")


# -- 3. download ----------------------------------------------------------------------


def serialized_big(model) -> bytes:
    import torch
    from nnsight.schema.request import RequestModel

    class Capture:
        blob = b""

        def __call__(self, tracer):
            Capture.blob = RequestModel.serialize(tracer, False)

    with model.trace(PROMPT, backend=Capture()):
        big = torch.arange(RESULT_NUMEL, dtype=torch.float32).save()  # noqa: F841
    return Capture.blob


def bench_download(table: Table, remote, url: str, root: Path, repeats: int) -> None:
    import httpx
    import torch

    headers = {"ndif-api-key": API_KEY, "nnsight-version": "0.8.1"}
    blob = serialized_big(remote)
    remote_rates, local_rates = [], []
    with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
        for _ in range(repeats):
            reply = http.post("/request", data={"data": json.dumps({"model_key": remote.to_model_key(),
                                                                      "compress": False})},
                              files={"blob": ("request", blob, "application/octet-stream")})
            reply.raise_for_status()
            job = reply.json()["id"]
            while True:
                response = http.get(f"/response/{job}").json()
                if response["status"] in ("COMPLETED", "ERROR"):
                    break
                time.sleep(0.05)
            if response["status"] != "COMPLETED" or not isinstance(response.get("data"), str):
                raise RuntimeError(f"the 100 MB job did not end with a download link: {response}")
            content = bytearray()
            started = time.perf_counter()
            with http.stream("GET", response["data"]) as download:
                download.raise_for_status()
                for chunk in download.iter_bytes(1 << 20):
                    content += chunk
            elapsed = time.perf_counter() - started
            saved = torch.load(io.BytesIO(bytes(content)), weights_only=False)
            values = saved["big"] if isinstance(saved, dict) and "big" in saved else None
            if values is None or not torch.equal(values, torch.arange(RESULT_NUMEL, dtype=torch.float32)):
                raise RuntimeError("the downloaded result is not the tensor the trace saved")
            remote_rates.append(len(content) / elapsed / 1e6)
            path = root / "result-copy.bin"
            path.write_bytes(content)
            started = time.perf_counter()
            with open(path, "rb") as handle:
                while handle.read(1 << 20):
                    pass
            local_rates.append(path.stat().st_size / (time.perf_counter() - started) / 1e6)
            path.unlink()
    table.add("download", f"{len(content) / 1e6:.0f} MB result from /result", statistics.median(remote_rates),
              "reading it from a local file", statistics.median(local_rates), "MB/s")


# -- 4. first LOG ----------------------------------------------------------------------


def long_job(model, seconds: float, **kwargs) -> None:
    """A print, then ``seconds`` of work; with an async backend the saves come from the backend."""
    import torch

    with model.trace(PROMPT, **kwargs):
        print("started")
        x = torch.ones(256, 256) / 256
        end = time.time() + seconds
        while time.time() < end:
            x = x @ x + 1 / 256
        logits = model.lm_head.output[:, -1].save()  # noqa: F841


def bench_first_log(table: Table, remote, local, url: str, seconds: float, repeats: int) -> None:
    from nnsight.intervention.backends.remote import AsyncRemoteBackend

    async def remote_once() -> tuple:
        backend = AsyncRemoteBackend(remote.to_model_key(), host=url)
        started = time.perf_counter()
        long_job(remote, seconds, backend=backend)
        first_log = None
        async for update in backend:
            if isinstance(update, dict):
                if not update:
                    raise RuntimeError("the long job's result came back empty")
                return first_log, time.perf_counter() - started
            if getattr(update, "status", None) is not None and update.status.name == "LOG" and first_log is None:
                if "started" in (update.description or ""):
                    first_log = time.perf_counter() - started
        raise RuntimeError("the long job ended without a result")

    class Stamp(io.StringIO):
        first: Optional[float] = None

        def write(self, text: str) -> int:
            if self.first is None and "started" in text:
                self.first = time.perf_counter()
            return super().write(text)

    remote_log, remote_total, local_log = [], [], []
    for _ in range(repeats):
        first, total = asyncio.run(remote_once())
        if first is None:
            raise RuntimeError("the client never received the job's LOG line")
        remote_log.append(first)
        remote_total.append(total)
        stamp = Stamp()
        stdout, sys.stdout = sys.stdout, stamp
        try:
            started = time.perf_counter()
            long_job(local, 0.0)
        finally:
            sys.stdout = stdout
        local_log.append(stamp.first - started)
    table.add("first LOG", f"print at the start of a {seconds:g} s job", statistics.median(remote_log),
              "the same print locally", statistics.median(local_log), "s")
    table.add("first LOG", "that job's time to result", statistics.median(remote_total), "", None, "s")


# -- 5. levels ----------------------------------------------------------------------


def bench_levels(table: Table, remote, expected, server, repeats: int) -> None:
    admin = Admin(server.url, API_KEY, REPO)
    from nnsight.intervention.backends.remote import RemoteBackend

    def trace() -> float:
        elapsed, logits = timed(lambda: small(remote, backend=RemoteBackend(remote.to_model_key(),
                                                                                  host=server.url)))
        check_same(logits, expected, "levels")
        return elapsed

    samples: dict[str, list] = {"HOT": [], "WARM": [], "COLD": []}
    try:
        for _ in range(repeats):
            admin.wait("HOT", running=True, timeout=300)
            samples["HOT"].append(trace())
            admin.evict()
            admin.wait("COLD", running=False, timeout=300)
            samples["COLD"].append(trace())
            admin.wait("HOT", running=True, timeout=300)
            admin.evict()
            admin.wait("COLD", running=False, timeout=300)
            admin.deploy("warm")
            admin.wait("WARM", running=True, timeout=300)
            samples["WARM"].append(trace())
    finally:
        admin.close()
    hot = statistics.median(samples["HOT"])
    for level in ("COLD", "WARM", "HOT"):
        table.add("levels", f"time to result, {level}", statistics.median(samples[level]),
                  "HOT" if level != "HOT" else "", hot if level != "HOT" else None, "s")


# -- the run ----------------------------------------------------------------------


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except OSError:
        return ""


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``make bench ARGS=...``; the README test reads them from here."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter windows (CI)")
    parser.add_argument("--clients", default="1,4,16", help="client process counts for throughput")
    parser.add_argument("--json", type=Path, default=ROOT / "test-output" / "bench.json")
    return parser


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(argv)
    repeats = 5 if args.quick else 30
    window = 4.0 if args.quick else 15.0
    counts = [int(part) for part in args.clients.split(",")]
    from nnhost.testing import ServerProcess, free_port, point_client_at

    root = Path(tempfile.mkdtemp(prefix="nnhost-bench-suite-"))
    every = cores()
    names = {"default threads": [], f"{every} threads per job": ["--torch-threads", str(every)]}
    ports = {name: free_port() for name in names}
    point_client_at(f"http://127.0.0.1:{ports['default threads']}", API_KEY, root)
    servers: dict = {}
    pool: Optional[ClientPool] = None
    table = Table()
    try:
        from nnhost.models.tiny import build_tiny_gpt2

        hf_home = root / "server-hf"
        snapshot = build_tiny_gpt2(REPO, hf_home=hf_home)
        for name, extra in names.items():
            servers[name] = ServerProcess([REPO], data_dir=root / name.replace(" ", "-"), hf_home=hf_home,
                                          api_key=API_KEY, port=ports[name], extra_args=extra).start()
        remote, local = client_and_local(snapshot)
        expected = small(local).detach()
        default = servers["default threads"]
        print(f"{every} cores; starting {max(counts)} client processes ...", flush=True)
        pool = ClientPool(max(counts), REPO)
        print("1. overhead", flush=True)
        bench_overhead(table, remote, local, default.url, repeats)
        print("2. throughput", flush=True)
        bench_throughput(table, pool, servers, local, counts, window, expected)
        pool.close()
        pool = None
        servers.pop(f"{every} threads per job").stop()
        print("3. download", flush=True)
        bench_download(table, remote, default.url, root, 2 if args.quick else 5)
        print("4. first LOG", flush=True)
        bench_first_log(table, remote, local, default.url, 2.0 if args.quick else 5.0, 2 if args.quick else 5)
        print("5. levels", flush=True)
        bench_levels(table, remote, expected, default, 1 if args.quick else 3)
    finally:
        if pool is not None:
            pool.close()
        for server in servers.values():
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    table.print()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "commit": commit(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cores": every,
        "python": platform.python_version(), "quick": args.quick, "clients": counts, "window_s": window,
        "repeats": repeats, "rows": table.rows,
    }, indent=2) + "\n")
    print(f"\nwritten to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

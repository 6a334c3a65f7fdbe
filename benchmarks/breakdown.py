"""Where does one small request's time go, stage by stage, against the floor?

Run it as::

    .venv/bin/python benchmarks/breakdown.py [--repeats N] [--designs fork,mapped]

Why it exists: the issue "faster than NDIF" measured nnhost adding ~26 ms over
the least any server can cost the nnsight client, and that sum says nothing
about where to cut. This benchmark puts the breakdown in the output, so it stays
visible after every change.

One run builds the small random test GPT-2, starts a real ``nnhost serve``
(`nnhost.testing.ServerProcess`) per execution design (``NNHOST_EXECUTION=fork``
and ``mapped``), and the **floor**: a minimal server in its own process, holding
the model and running each trace in its request handler with nnhost's own
`Runner` (no queue, no database, no files, no isolation, the result sent back on
the websocket). The same unmodified nnsight 0.8.1 client drives all of them in
one run, taking turns block by block, so drift on the machine hits each alike.
A block is a few requests back to back (``--block``, 5), as a user's loop sends
them, after a moment of quiet: what a server does after its reply (a job
process's exit, the next one's fork and warm-up) lands on its own next request,
never on another server's. Alternating single requests put each server's
trailing work on the next server's request and moved the figures by several ms.

What is measured, all on the client's clock (one clock, so no skew): a
subclass of the client's `RemoteBackend` that only stamps times around the
methods the client already calls (serialize, POST, each websocket frame's
arrival, download, load), and the wall time around ``with model.trace(...)``.
Nothing in nnsight is modified. Around RUNNING and COMPLETED, the job's own
``meta`` splits the stages further: ``total_seconds``, of it
``deserialize_seconds`` (reading the request), ``runtime`` and
``serialize_seconds`` (writing the result), and ``integrity_seconds``. Those
figures come from the job process about itself, so they are shown for
display only, never subtracted into a stage of the table's sum.

Then **throughput**: real nnsight client processes (`bench_clients.ClientPool`,
the blocking client through the websocket, each result checked against the
local one) run traces back to back for ``--seconds`` against each server in
turn, two rounds, at each of ``--clients`` (8 and 16 by default); the table
gives jobs per second and each nnhost design's ratio to the floor, and the
clients' own CPU per job: the clients share the server's cores, so no server
can pass the cores divided by it (the floor, whose one process runs both HTTP
and traces, is no such bound). The issue
"faster than NDIF" also asks for the reference NDIF server beside them when it
is installed. Its stack (Ray, Redis, its API under gunicorn, a model deployed
to it) is the operator's to start, in its own environment: ``--ndif URL``
names it, and it then takes its turns beside the others, in the stage table
and in throughput, serving the same model (``REPO_ID``, built with
`nnhost.models.tiny.build_tiny_gpt2` into its cache, float32). Without it the
output says NDIF was not measured.

It must never assert on a time: the machines are shared and noisy.
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
import uuid
import warnings
from pathlib import Path
from typing import Annotated, Any, Optional

from bench_clients import ClientPool
from common import PROMPT, client_models

# At module level: FastAPI reads the floor's handlers' annotations (strings, under
# `from __future__ import annotations`) in this module's globals.
from fastapi import Form, UploadFile, WebSocket, WebSocketDisconnect

REPO_ID = "nnhost-bench/breakdown-tiny"
API_KEY = "nnh_bench_" + "d" * 40
WARMUP = 3
#: Seconds of quiet before each server's block of requests (see `main`).
QUIET = 0.3

# Stages in order along the critical path; each is the time between two stamps.
STAGES = [
    ("trace", "enter", "serialize_start", "client: build the trace"),
    ("serialize", "serialize_start", "serialize_end", "client: serialize (+zstd)"),
    ("subscribe", "serialize_end", "post_start", "websocket connect + session id"),
    ("post", "post_start", "RECEIVED", "POST /request -> RECEIVED reply"),
    ("queued", "RECEIVED", "QUEUED", "RECEIVED -> QUEUED frame"),
    ("dispatched", "QUEUED", "DISPATCHED", "QUEUED -> DISPATCHED frame"),
    ("running", "DISPATCHED", "RUNNING", "DISPATCHED -> RUNNING frame"),
    ("completed", "RUNNING", "COMPLETED", "RUNNING -> COMPLETED frame"),
    ("download", "COMPLETED", "downloaded", "download result"),
    ("load", "downloaded", "loaded", "client: decompress + torch.load"),
    ("exit", "loaded", "exit", "client: push saves, leave trace"),
]


# --- the floor server ------------------------------------------------------------------


def floor_server(port: int, snapshot: str) -> None:
    """The least any server costs this client: the trace run in the request handler."""
    import uvicorn
    from fastapi import FastAPI
    from nnsight import LanguageModel
    from nnsight.schema.response import ResponseModel, Status

    from nnhost.execution.events import JobEvent, JobSpec
    from nnhost.execution.job.runner import Runner

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LanguageModel(snapshot, dispatch=True)
    for parameter in model._module.parameters():
        parameter.requires_grad_(False)
    runner = Runner(model)  # trusted: no sandboxing unpickler, no guard
    # One trace at a time, as one replica runs them: two at once in one model
    # would interleave their hooks.
    from concurrent.futures import ThreadPoolExecutor

    one_at_a_time = ThreadPoolExecutor(1)
    sockets: dict[str, WebSocket] = {}
    app = FastAPI()

    @app.websocket("/subscribe")
    async def subscribe(socket: WebSocket) -> None:
        await socket.accept()
        session = uuid.uuid4().hex
        sockets[session] = socket
        await socket.send_text(json.dumps({"session_id": session}))
        try:
            while True:
                await socket.receive_text()
        except WebSocketDisconnect:
            sockets.pop(session, None)

    @app.post("/request")
    async def request(data: Annotated[str, Form()], blob: Annotated[UploadFile, Form()]) -> dict:
        import asyncio

        metadata = json.loads(data)
        job = uuid.uuid4().hex
        payload = await blob.read()
        compress = bool(metadata.get("compress"))

        def run() -> Optional[ResponseModel]:
            # memfds: the runner reads and writes descriptors, and no disk is touched.
            payload_fd = os.memfd_create("payload")
            result_fd = os.memfd_create("result")
            os.write(payload_fd, payload)
            os.lseek(payload_fd, 0, os.SEEK_SET)
            events: list[JobEvent] = []
            # The runner closes the descriptors it is handed; the result's is a copy.
            spec = JobSpec(job, "", compress, env=metadata.get("env") or {},
                           payload_fd=payload_fd, result_fd=os.dup(result_fd))
            runner.run(spec, events.append)
            final = events[-1]
            if final.status != "COMPLETED":
                os.close(result_fd)
                return ResponseModel(id=job, status=Status.ERROR, description=final.description)
            os.lseek(result_fd, 0, os.SEEK_SET)
            with os.fdopen(result_fd, "rb") as file:
                result = file.read()
            return ResponseModel(id=job, status=Status.COMPLETED, data=result, meta=final.meta)

        async def later() -> None:
            try:
                response = await asyncio.get_running_loop().run_in_executor(one_at_a_time, run)
            except Exception as error:  # said to the client, which would otherwise wait forever
                response = ResponseModel(id=job, status=Status.ERROR, description=repr(error))
            socket = sockets.get(metadata.get("session_id") or "")
            if socket is not None and response is not None:
                if response.status == Status.COMPLETED:
                    await socket.send_bytes(response.pickle())
                else:
                    await socket.send_text(response.model_dump_json())

        asyncio.get_running_loop().create_task(later())
        return ResponseModel(id=job, status=Status.RECEIVED).model_dump(exclude_none=True)

    @app.get("/ping")
    async def ping() -> str:
        return "pong"

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class FloorProcess:
    def __init__(self, port: int, snapshot: Path, log_path: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--floor-server", str(port), str(snapshot)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def wait(self, timeout: float = 120.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the floor server exited early")
            try:
                httpx.get(f"{self.url}/ping", timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise TimeoutError("the floor server did not start")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


# --- the stamping client ---------------------------------------------------------------


def stamping_backend(model_key: str, host: str):
    """A `RemoteBackend` that records when each step of the client's own path happened."""
    from nnsight.intervention.backends.remote import RemoteBackend

    class Stamping(RemoteBackend):
        def __init__(self) -> None:
            super().__init__(model_key, host=host)
            self.stamps: dict[str, float] = {}
            self.job_id = ""

        def stamp(self, name: str) -> None:
            # The first time only: a status repeated (LOG frames) keeps its first arrival.
            self.stamps.setdefault(name, time.perf_counter())

        def _serialize(self, tracer):
            self.stamp("serialize_start")
            blob = super()._serialize(tracer)
            self.stamp("serialize_end")
            return blob

        def _post(self, request, blob):
            self.stamp("post_start")
            response = super()._post(request, blob)
            self.stamp(response.status.value)
            self.job_id = response.id
            return response

        def parse(self, message):
            arrived = time.perf_counter()
            response = RemoteBackend.parse(message)
            self.stamps.setdefault(response.status.value, arrived)
            return response

        def finalize(self, content):
            self.stamp("downloaded")
            result = super().finalize(content)
            self.stamp("loaded")
            return result

    return Stamping()


def one_request(model, url: str) -> tuple[dict[str, float], dict, Any]:
    backend = stamping_backend(model.to_model_key(), url)
    # The wall clock's offset, to place the server's job row (time.time(), same machine)
    # on this request's perf_counter line.
    offset = time.time() - time.perf_counter()
    entered = time.perf_counter()
    with model.trace(PROMPT, backend=backend):
        logits = model.lm_head.output[:, -1].save()
    left = time.perf_counter()
    stamps = dict(backend.stamps, enter=entered, exit=left, offset=offset)
    return stamps, dict(backend.meta or {}, job_id=backend.job_id), logits


# Marks from the server's job row against the client's stamps, both on this
# machine's wall clock: (label, from, to); a name in ROW is a column of `jobs`.
ROW = ("created_at", "started_at", "updated_at")
ROW_SPANS = [
    ("POST sent -> job built (created_at: client httpx, upload, auth)", "post_start", "created_at"),
    ("job built -> RECEIVED reply in hand (payload, insert, accept)", "created_at", "RECEIVED"),
    ("job built -> started_at (payload, insert, queue, hand-off)", "created_at", "started_at"),
    ("started_at -> RUNNING frame (replica, job process, deserialize)", "started_at", "RUNNING"),
    ("RUNNING frame -> row's last update (run, write, COMPLETED stored)", "RUNNING", "updated_at"),
    ("row's last update -> COMPLETED frame in hand", "updated_at", "COMPLETED"),
]


def row_spans(stamps: dict[str, float], row: dict[str, float]) -> dict[str, float]:
    marks = {name: stamps[name] + stamps["offset"] for name in stamps if name not in ("offset",)}
    marks.update({name: row[name] for name in ROW if row.get(name) is not None})
    return {label: (marks[end] - marks[start]) * 1000 for label, start, end in ROW_SPANS
            if start in marks and end in marks}


def job_rows(database: Path) -> dict[str, dict[str, float]]:
    import sqlite3

    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        cursor = connection.execute("SELECT id, created_at, started_at, updated_at FROM jobs")
        return {row[0]: dict(zip(ROW, row[1:])) for row in cursor}


def stage_times(stamps: dict[str, float]) -> dict[str, float]:
    """Milliseconds per stage; a frame a server never sends (the floor's QUEUED...)
    folds its stage into the next one, so the stages always add up to the total."""
    times: dict[str, float] = {}
    previous_end = stamps["enter"]
    for name, _, end, _ in STAGES:
        if end in stamps:
            times[name] = (stamps[end] - previous_end) * 1000
            previous_end = stamps[end]
        else:
            times[name] = 0.0
    times["total"] = (stamps["exit"] - stamps["enter"]) * 1000
    return times


# --- the table -------------------------------------------------------------------------


def print_row_spans(spans: dict[str, list[dict[str, float]]]) -> None:
    print()
    print("nnhost's own marks (the job row's times, written by the server) against the client's"
          " stamps, medians, ms:")
    names = list(spans)
    width = max(len(label) for label, _, _ in ROW_SPANS)
    print(f"  {'span':<{width}}  " + "  ".join(f"{name:>8}" for name in names))
    for label, _, _ in ROW_SPANS:
        cells = []
        for name in names:
            values = [row[label] for row in spans[name] if label in row]
            cells.append(f"{statistics.median(values):8.2f}" if values else f"{'-':>8}")
        print(f"  {label:<{width}}  " + "  ".join(cells))
    print("  (frames are stamped when the client reads them: QUEUED/DISPATCHED pushed during the POST")
    print("   are read after its reply, so the POST stage above holds the server's queue and hand-off too)")


def print_table(results: dict[str, list[dict[str, float]]], metas: dict[str, list[dict]], repeats: int,
                block: int) -> None:
    names = list(results)
    medians = {name: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
               for name, rows in results.items()}
    floor_total = medians["floor"]["total"]
    headers = ["stage"]
    for name in names:
        headers += [f"{name} ms", "share"] if name != "floor" else ["floor ms"]
    headers += [f"{name} - floor" for name in names if name != "floor"]
    table: list[list[str]] = []
    for stage, _, _, label in STAGES:
        row = [f"{stage:<10} {label}"]
        for name in names:
            value = medians[name][stage]
            row.append(f"{value:.2f}")
            if name != "floor":
                row.append(f"{100 * value / medians[name]['total']:.0f}%")
        row += [f"{medians[name][stage] - medians['floor'][stage]:+.2f}" for name in names if name != "floor"]
        table.append(row)
    row = ["total      client wall time (median)"]
    for name in names:
        row.append(f"{medians[name]['total']:.2f}")
        if name != "floor":
            row.append("100%")
    row += [f"{medians[name]['total'] - floor_total:+.2f}" for name in names if name != "floor"]
    table.append(row)
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join([cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))])

    print()
    print(f"Critical path of one small trace, client clock, median of {repeats} runs per server "
          f"(after {WARMUP} warm-ups), in blocks of {block} back to back, servers taking turns:")
    print(line(headers))
    print(line(["-" * w for w in widths]))
    for cells in table:
        print(line(cells))
    print()
    print("Inside RUNNING -> COMPLETED (and before it), what the job process says of itself"
          " (display only, medians, ms):")
    keys = ["total_seconds", "deserialize_seconds", "runtime", "serialize_seconds", "integrity_seconds"]
    print("  " + "  ".join(f"{k:>19}" for k in ["server", *keys]))
    for name in names:
        cells = []
        for key in keys:
            values = [m[key] * 1000 for m in metas[name] if isinstance(m.get(key), (int, float))]
            cells.append(f"{statistics.median(values):.2f}" if values else "-")
        print("  " + "  ".join(f"{c:>19}" for c in [name, *cells]))
    print()
    print("A stage whose frame a server never sends (the floor has no QUEUED, DISPATCHED,")
    print("RUNNING) counts 0 and its time falls into the next stage. Medians per stage need")
    print("not add up to the median total. Shared, noisy machine: compare within one run only.")
    print("The POST stage holds ~20 ms of the client's own: nnsight builds a fresh httpx.Client")
    print("(an SSL context, even for http) per request; the floor pays it too.")


# --- throughput ------------------------------------------------------------------------

ROUNDS = 2
#: A figure per server, per client count, per round (jobs/s; or the clients' CPU seconds per job).
Rates = dict[str, dict[int, list[float]]]


#: The throughput rows besides one user's (every client uses the same key): as
#: many users as clients (a key each, on the nnhost servers).
A_USER_EACH = "a user each"


def measure_throughput(urls: dict[str, str], counts: list[int], seconds: float, expected: Any,
                       keys: dict[str, list[str]]) -> tuple[Rates, Rates]:
    """Jobs per second of each server at each client count, ``ROUNDS`` rounds, servers alternating;
    and the clients' own CPU seconds per job in each of those rounds.

    Each server named in ``keys`` is also measured with a user per client
    (rows named ``"<server>, a user each"``); the others with one user only.
    """
    print(f"\nstarting {max(counts)} client processes ...", flush=True)
    pool = ClientPool(max(counts), REPO_ID)
    runs = [(name, url, None) for name, url in urls.items()]
    runs += [(f"{name}, {A_USER_EACH}", urls[name], keys[name]) for name in urls if name in keys]
    rates: Rates = {name: {count: [] for count in counts} for name, _, _ in runs}
    client_cpu: Rates = {name: {count: [] for count in counts} for name, _, _ in runs}
    try:
        for count in counts:
            for _ in range(ROUNDS):
                for name, url, each in runs:
                    rates[name][count].append(pool.rate(url, count, seconds, expected, each))
                    client_cpu[name][count].append(pool.client_cpu_per_job)
    finally:
        pool.close()
    return rates, client_cpu


def print_throughput(rates: Rates, client_cpu: Rates, ndif: bool) -> None:
    names = list(rates)
    counts = list(rates[names[0]])
    print()
    print(f"Throughput: real nnsight client processes back to back, jobs/s per round ({ROUNDS} rounds,"
          " servers alternating), and the ratio of the rounds' means to the floor's. A plain name: one"
          f" user's clients (one key); \"{A_USER_EACH}\": a key per client, so no two share a job process:")
    width = max(len(name) for name in names)
    for count in counts:
        floor_mean = statistics.mean(rates["floor"][count])
        for name in names:
            values = rates[name][count]
            ratio = "" if name == "floor" else f"   {statistics.mean(values) / floor_mean:.2f}x the floor"
            print(f"  {count:>3} clients  {name:<{width}}  " + "  ".join(f"{v:6.1f}" for v in values) + ratio)
    # The clients run on these cores too: their own CPU per job caps every server.
    cores = os.cpu_count() or 1
    ceilings = {}
    for count in counts:
        per_job = statistics.median(v for name in names for v in client_cpu[name][count] if v > 0)
        ceilings[count] = cores / per_job
        print(f"  {count:>3} clients  the clients' own CPU: {per_job * 1000:.1f} ms per job, so on"
              f" {cores} cores no server can pass {ceilings[count]:.1f} jobs/s")
    if ndif:
        for count in counts:
            ndif_mean = statistics.mean(rates["ndif"][count])
            print(f"  {count:>3} clients  against NDIF: " + ", ".join(
                f"{name} {statistics.mean(rates[name][count]) / ndif_mean:.2f}x"
                for name in names if name != "ndif")
                + f"; the clients' ceiling {ceilings[count] / ndif_mean:.2f}x")
    else:
        print("  NDIF: not measured (no --ndif URL): start the reference server, serving this"
              f" benchmark's {REPO_ID}, and name it.")


# --- main ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed requests per server")
    parser.add_argument("--block", type=int, default=5,
                        help="requests back to back per server before the next server's turn")
    parser.add_argument("--designs", default="fork,mapped", help="NNHOST_EXECUTION values to measure")
    parser.add_argument("--json", type=Path, default=None, help="also write the per-request stages here")
    parser.add_argument("--clients", default="8,16", help="client process counts for throughput (empty: none)")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of one throughput round")
    parser.add_argument("--ndif", default="", help="URL of a running reference NDIF server to measure beside")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    designs = [d for d in args.designs.split(",") if d]
    counts = [int(c) for c in args.clients.split(",") if c]

    from nnhost.testing import ServerProcess, free_port, point_client_at

    root = Path(tempfile.mkdtemp(prefix="nnhost-breakdown-"))
    servers: dict[str, Any] = {}
    floor: Optional[FloorProcess] = None
    ports = {design: free_port() for design in designs}
    # The client's environment, set before huggingface_hub is imported: it builds its
    # meta model from the first server's Hub mirror.
    point_client_at(f"http://127.0.0.1:{ports[designs[0]]}", API_KEY, root / "client")
    try:
        from nnhost.models.tiny import build_tiny_gpt2

        hf_home = root / "server-hf"
        snapshot = build_tiny_gpt2(REPO_ID, hf_home=hf_home)
        floor = FloorProcess(free_port(), snapshot, root / "floor.log")
        for design in designs:
            print(f"starting nnhost ({design}) ...", flush=True)
            servers[design] = ServerProcess(
                [REPO_ID], data_dir=root / f"data-{design}", hf_home=hf_home, api_key=API_KEY,
                env={"NNHOST_EXECUTION": design}, port=ports[design],
            ).start()
        floor.wait()

        import torch
        import websocket

        # A server that never answers fails the run instead of hanging it.
        websocket.setdefaulttimeout(120)

        model, _, expected = client_models(REPO_ID, snapshot)

        urls = {"floor": floor.url, **{d: s.url for d, s in servers.items()}}
        if args.ndif:
            urls["ndif"] = args.ndif.rstrip("/")
        for name, url in urls.items():
            for _ in range(WARMUP):
                _, _, logits = one_request(model, url)
                assert torch.allclose(logits, expected, rtol=1e-5, atol=1e-6), f"{name} differs"
        results: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
        metas: dict[str, list[dict]] = {name: [] for name in urls}
        all_stamps: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
        while min(len(r) for r in results.values()) < args.repeats:
            for name, url in urls.items():
                # Between blocks the machine goes quiet: a server's work after its
                # last reply (a process's exit, the next one's fork) lands on its
                # own next request, as in a user's loop, never on another server's.
                time.sleep(QUIET)
                for _ in range(min(args.block, args.repeats - len(results[name]))):
                    stamps, meta, _ = one_request(model, url)
                    results[name].append(stage_times(stamps))
                    metas[name].append(meta)
                    all_stamps[name].append(stamps)
        print_table(results, metas, args.repeats, args.block)
        spans: dict[str, list[dict[str, float]]] = {}
        for design, server in servers.items():
            rows = job_rows(server.data_dir / "nnhost.sqlite3")
            spans[design] = [row_spans(stamps, rows[meta["job_id"]])
                             for stamps, meta in zip(all_stamps[design], metas[design])
                             if meta["job_id"] in rows]
        print_row_spans(spans)
        rates: Rates = {}
        client_cpu: Rates = {}
        if counts:
            keys = {design: server.user_keys(max(counts), "bench") for design, server in servers.items()}
            rates, client_cpu = measure_throughput(urls, counts, args.seconds, expected.detach(), keys)
            print_throughput(rates, client_cpu, bool(args.ndif))
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"stages": results, "meta": metas, "throughput": rates,
                                              "client_cpu_per_job": client_cpu}, indent=1))
        return 0
    finally:
        for server in servers.values():
            server.stop()
        if floor is not None:
            floor.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--floor-server":
        floor_server(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(main())

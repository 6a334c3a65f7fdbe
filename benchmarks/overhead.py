"""How much does running a trace through nnhost cost, compared with running it locally?

Run it as::

    .venv/bin/python benchmarks/overhead.py [--repeats N]

One run builds the small random test GPT-2 into a temporary Hugging Face cache,
starts a real ``nnhost serve`` on a free loopback port (`nnhost.testing.ServerProcess`),
and points the real nnsight client at it the way a user would (``NDIF_HOST``,
``NDIF_API_KEY``, ``HF_ENDPOINT=<server>/hub``, an empty ``HF_HOME``), so the
remote model is a meta model described by the server's Hub mirror. The local
comparison model is the same weights loaded in this process.

Each case runs 2 warm-up times, then ``N`` timed times, on each side (local
and remote runs interleaved):

- ``small``: save the last position's logits, a few KB of result.
- ``20MB``: also save ``torch.randn(5_000_000)`` (20 MB of float32) made inside
  the trace, so the result goes from the server to the client by download.
- ``20MB (no compress)``: the same with ``CONFIG.API.COMPRESS = False``; the
  other cases keep the client's default (compressed with zstd). Random floats
  barely compress, so this shows what compression itself costs.

What is timed is the client's wall-clock time (``time.perf_counter``) around the
``with model.trace(...)`` block, the only number a user sees. On the remote side
that covers serializing the block, the websocket subscribe, the HTTP POST,
queueing and running in the server's worker process, staging the result, and
downloading and loading it. Remote status logging is off so the terminal
display doesn't get timed.

How to read the table:

- ``local ms`` / ``remote ms`` are medians; ``remote p90`` shows the tail.
- ``remote/local`` is the ratio of the medians. The test model is tiny, so a
  local trace takes a few milliseconds and the ratio is mostly fixed
  per-request overhead divided by almost nothing: expect it to be large. It is
  an upper bound, not what a real model sees. With a real model the forward pass
  grows, the overhead doesn't, and the ratio moves towards 1. ``overhead ms``
  (remote minus local) is the number that carries over to real models.
- ``server run ms`` is the server's own ``meta["runtime"]``: the time spent
  executing the trace inside the worker. ``server total ms`` is
  ``meta["total_seconds"]``: deserializing the request, running it, and
  serializing and writing the result. ``remote ms - server total ms`` is what
  the transport costs: client-side serialization, HTTP and websocket round
  trips, queueing and dispatch, and the download.

Before timing anything, the remote results are checked against the local ones
(allclose), so a broken path can't pass for a fast one.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Optional

REPO_ID = "nnhost-bench/tiny-gpt2"
API_KEY = "nnh_bench_" + "b" * 40
PROMPT = "The Eiffel Tower is in the city of"
BIG_NUMEL = 5_000_000  # 20 MB of float32
WARMUP = 2


# --- the programs ------------------------------------------------------------
#
# Each takes the model and either a backend (remote) or None (local), runs one
# trace, and returns (elapsed seconds, saved values). Only the `with` block is
# timed.


def small_trace(model, backend) -> tuple[float, dict]:
    kwargs = {"backend": backend} if backend is not None else {"remote": False}
    started = time.perf_counter()
    with model.trace(PROMPT, **kwargs):
        logits = model.lm_head.output[:, -1].save()
    elapsed = time.perf_counter() - started
    return elapsed, {"logits": logits}


def big_trace(model, backend) -> tuple[float, dict]:
    import torch

    kwargs = {"backend": backend} if backend is not None else {"remote": False}
    started = time.perf_counter()
    with model.trace(PROMPT, **kwargs):
        generator = torch.Generator().manual_seed(0)
        big = torch.randn(BIG_NUMEL, generator=generator).save()
        logits = model.lm_head.output[:, -1].save()
    elapsed = time.perf_counter() - started
    return elapsed, {"big": big, "logits": logits}


# --- measuring ----------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def check_same(remote: dict, local: dict, case: str) -> None:
    import torch

    assert remote.keys() == local.keys(), f"{case}: saved {sorted(remote)} != {sorted(local)}"
    for name in local:
        a, b = remote[name], local[name]
        assert isinstance(a, torch.Tensor), f"{case}: {name} came back as {type(a).__name__}"
        assert a.shape == b.shape and a.dtype == b.dtype, (
            f"{case}: {name} is {a.dtype}{tuple(a.shape)} remotely, {b.dtype}{tuple(b.shape)} locally"
        )
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"{case}: {name} differs from local"


def measure(
    case: str,
    program: Callable,
    remote_model,
    local_model,
    repeats: int,
    compress: bool,
) -> dict:
    from nnsight import CONFIG
    from nnsight.intervention.backends.remote import RemoteBackend

    previous = CONFIG.API.COMPRESS
    CONFIG.API.COMPRESS = compress
    try:

        def remote_once() -> tuple[float, dict, dict]:
            # A fresh backend per call, as `remote=True` makes; it reads
            # CONFIG.API.COMPRESS when built, and keeps the job's meta afterwards.
            backend = RemoteBackend(remote_model.to_model_key())
            elapsed, saves = program(remote_model, backend)
            return elapsed, saves, backend.meta or {}

        # Correctness first: one remote and one local run must agree.
        _, remote_saves, _ = remote_once()
        _, local_saves = program(local_model, None)
        check_same(remote_saves, local_saves, case)

        for _ in range(WARMUP):
            remote_once()
            program(local_model, None)

        local_times: list[float] = []
        remote_times: list[float] = []
        server_runtime: list[float] = []
        server_total: list[float] = []
        result_bytes: Optional[int] = None
        # Interleave, so drift (other load on the machine) hits both sides alike.
        for _ in range(repeats):
            elapsed, _ = program(local_model, None)
            local_times.append(elapsed)
            elapsed, _, meta = remote_once()
            remote_times.append(elapsed)
            if "runtime" in meta:
                server_runtime.append(meta["runtime"])
            if "total_seconds" in meta:
                server_total.append(meta["total_seconds"])
            result_bytes = meta.get("result_bytes", result_bytes)
    finally:
        CONFIG.API.COMPRESS = previous

    local_median = statistics.median(local_times)
    remote_median = statistics.median(remote_times)
    return {
        "case": case,
        "local": local_median,
        "remote": remote_median,
        "ratio": remote_median / local_median if local_median > 0 else float("inf"),
        "overhead": remote_median - local_median,
        "remote_p90": percentile(remote_times, 90),
        "server_runtime": statistics.median(server_runtime) if server_runtime else None,
        "server_total": statistics.median(server_total) if server_total else None,
        "result_bytes": result_bytes,
    }


def print_table(rows: list[dict], repeats: int) -> None:
    def ms(value: Optional[float]) -> str:
        return "-" if value is None else f"{value * 1000:.1f}"

    def size(value: Optional[int]) -> str:
        if value is None:
            return "-"
        if value >= 1 << 20:
            return f"{value / (1 << 20):.1f} MB"
        return f"{value / 1024:.1f} KB"

    headers = [
        "case",
        "local ms",
        "remote ms",
        "remote/local",
        "overhead ms",
        "remote p90",
        "server run ms",
        "server total ms",
        "result",
    ]
    table = [
        [
            row["case"],
            ms(row["local"]),
            ms(row["remote"]),
            f"{row['ratio']:.1f}x",
            ms(row["overhead"]),
            ms(row["remote_p90"]),
            ms(row["server_runtime"]),
            ms(row["server_total"]),
            size(row["result_bytes"]),
        ]
        for row in rows
    ]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest])

    print()
    print(f"Client wall time per trace, median of {repeats} (after {WARMUP} warm-ups):")
    print(line(headers))
    print(line(["-" * w for w in widths]))
    for cells in table:
        print(line(cells))
    print()
    print("overhead = remote - local; server run = meta['runtime'] (execution in the worker);")
    print("server total = meta['total_seconds'] (deserialize + run + serialize + write result);")
    print("remote - server total = client serialization, HTTP/websocket, queueing, download.")
    print("result = bytes the server staged (compressed when compression is on).")


# --- main -----------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per case and side")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    from nnhost.testing import ServerProcess, free_port, point_client_at

    root = Path(tempfile.mkdtemp(prefix="nnhost-bench-"))
    port = free_port()
    server_url = f"http://127.0.0.1:{port}"

    # The client's environment, set before nnsight / huggingface_hub are imported.
    point_client_at(server_url, API_KEY, root)

    server: Optional[ServerProcess] = None
    try:
        from nnhost.models.tiny import build_tiny_gpt2

        server_hf_home = root / "server-hf"
        print(f"building {REPO_ID} in {server_hf_home} ...", flush=True)
        snapshot = build_tiny_gpt2(REPO_ID, hf_home=server_hf_home)

        print(f"starting nnhost on {server_url} ...", flush=True)
        server = ServerProcess(
            [REPO_ID],
            data_dir=root / "server-data",
            hf_home=server_hf_home,
            api_key=API_KEY,
            port=port,
        )
        server.start()

        import nnsight
        from nnsight import LanguageModel

        nnsight.CONFIG.APP.REMOTE_LOGGING = False

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            remote_model = LanguageModel(REPO_ID)
            local_model = LanguageModel(str(snapshot), dispatch=True)
        for parameter in local_model._module.parameters():
            parameter.requires_grad_(False)

        default_compress = bool(nnsight.CONFIG.API.COMPRESS)
        cases = [
            (f"small (last-pos logits){', compress' if default_compress else ''}", small_trace, default_compress),
            (f"20MB + logits{', compress' if default_compress else ''}", big_trace, default_compress),
            ("20MB + logits, no compress", big_trace, False),
        ]
        rows = []
        for case, program, compress in cases:
            print(f"measuring {case} (compress={compress}) ...", flush=True)
            rows.append(measure(case, program, remote_model, local_model, args.repeats, compress))

        print_table(rows, args.repeats)
        return 0
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""What does a user wait for when the model is HOT, WARM or COLD?

Run it as::

    .venv/bin/python benchmarks/hotswap.py [--repeats N]

One run builds a random GPT-2 a few tens of MB big (6 layers, 256 wide) into a
temporary Hugging Face cache, starts a real ``nnhost serve`` on a free loopback
port (`nnhost.testing.ServerProcess`, whose ``--api-key`` is the admin's key),
and points the real nnsight client at it the way a user would (``NDIF_HOST``,
``NDIF_API_KEY``, ``HF_ENDPOINT=<server>/hub``, an empty ``HF_HOME``).

The timed program is always the same small trace::

    with model.trace(PROMPT, remote=True):
        logits = model.lm_head.output[:, -1].save()

timed with ``time.perf_counter`` from entering the ``with`` block to having
``logits`` (remote status logging off), with the model at each level:

- ``HOT``: the model is already deployed and serving; just run the trace.
- ``COLD``: ``POST /admin/evict``, wait until ``/status`` shows it COLD, then
  run the trace. The request itself deploys the model (a new worker process:
  start it, import torch/transformers/nnsight, load the weights), so this is
  the on-demand deploy as a user sees it.
- ``WARM``: ``POST /admin/deploy {"level": "warm"}``, wait until ``/status``
  shows WARM and RUNNING, then run the trace (the server promotes it to HOT).
  ``/admin/deploy`` only ever raises a level, so when the model is HOT the
  request is answered with target HOT and nothing changes; the script then
  goes through COLD (evict, wait COLD, deploy warm), and says so once.

For reference, the same snapshot is loaded in this process:

- ``transformers.AutoModelForCausalLM.from_pretrained(snapshot)``;
- ``nnsight.LanguageModel(snapshot, dispatch=True)`` (which also loads the
  tokenizer and wraps the model, like the server's worker does).

Both local loads run once untimed first (printed separately); the libraries
are already imported by then (building the model imports them), so the table
shows what loading the weights itself costs. The server's COLD and WARM
deploys, by contrast, start a fresh worker process that imports torch,
transformers and nnsight before loading.

Every timed step (trace or load) starts after ``gc.collect()`` and half a
second of idling, so none runs right after busy work (on a 2-core machine,
torch's threads still spinning after a load slow the next trace noticeably).

Each case runs ``N`` times (default 3). The cases are interleaved per round
(HOT, COLD, WARM, local loads), so drift hits them alike. The table shows
median, min and max, and the median's ratio to HOT's median. Every remote
result is checked against a local run of the same trace (allclose), so a broken
path can't pass for a fast one.

Beside the table the script prints what it saw while preparing each level: how
long ``/status`` took to show the level after the admin call (for WARM this is
the server loading the model into host memory), and the worker's own
"Loaded in ..." from ``/status``. Any admin endpoint answering with an HTTP
error, or a level that never shows, stops the run with exactly what the
server said.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import signal
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

REPO_ID = "nnhost-bench/hotswap-gpt2"
API_KEY = "nnh_bench_" + "h" * 40
PROMPT = "The Eiffel Tower is in the city of"
WARMUP = 2  # untimed HOT traces first (the client's first trace is slower)
POLL = 0.05  # seconds between /status polls
SETTLE = 0.5  # seconds of quiet before each timed step, so none starts right after busy work


class EndpointError(RuntimeError):
    """An admin endpoint or /status did something this benchmark did not expect."""


# --- talking to the server -------------------------------------------------------


class Admin:
    """The operator endpoints and /status, over plain HTTP with the admin key."""

    def __init__(self, url: str, key: str, model: str) -> None:
        import httpx

        self.model = model
        self.client = httpx.Client(base_url=url, headers={"ndif-api-key": key}, timeout=30)

    def close(self) -> None:
        self.client.close()

    def _post(self, path: str, body: dict) -> dict:
        response = self.client.post(path, json=body)
        if response.status_code != 200:
            raise EndpointError(
                f"POST {path} {body} answered HTTP {response.status_code}: {response.text}"
            )
        return response.json()

    def deploy(self, level: str) -> dict:
        return self._post("/admin/deploy", {"model": self.model, "level": level})

    def evict(self) -> dict:
        return self._post("/admin/evict", {"model": self.model})

    def entries(self) -> list[dict]:
        """This model's /status entries (one per replica, or one COLD entry)."""
        response = self.client.get("/status")
        if response.status_code != 200:
            raise EndpointError(f"GET /status answered HTTP {response.status_code}: {response.text}")
        deployments = response.json()["deployments"]
        return [
            entry
            for name, entry in deployments.items()
            if entry.get("deployment", name.split("#")[0]) == self.model
        ]

    def wait(self, level: str, running: bool, timeout: float) -> tuple[float, list[dict]]:
        """Poll /status until every entry shows ``level`` (and RUNNING if asked).

        Returns the seconds it took and the entries seen last.
        """
        started = time.perf_counter()
        deadline = started + timeout
        seen: list[tuple] = []
        while True:
            entries = self.entries()
            shown = [(e["deployment_level"], e["application_state"]) for e in entries]
            if not seen or seen[-1] != tuple(shown):
                seen.append(tuple(shown))
            if entries and all(
                e["deployment_level"] == level and (not running or e["application_state"] == "RUNNING")
                for e in entries
            ):
                return time.perf_counter() - started, entries
            if any(e["application_state"] == "UNHEALTHY" for e in entries):
                raise EndpointError(
                    f"waiting for {level}, /status shows UNHEALTHY: "
                    f"{[e.get('description') for e in entries]}"
                )
            if time.perf_counter() > deadline:
                raise EndpointError(
                    f"/status did not show {level}{' RUNNING' if running else ''} within "
                    f"{timeout:g}s; (level, state) sequence seen: {seen}; last entries: {entries}"
                )
            time.sleep(POLL)


def loaded_in(entries: list[dict]) -> Optional[str]:
    """The worker's own "Loaded in N s." from /status, while it is still the last line."""
    for entry in entries:
        description = entry.get("description") or ""
        if description.startswith("Loaded in"):
            return description
    return None


# --- timing ------------------------------------------------------------------------


class TraceTimeout(Exception):
    pass


def with_deadline(seconds: float, function: Callable[[], Any]) -> Any:
    """Run ``function``; raise TraceTimeout if it takes longer (SIGALRM, main thread)."""

    def alarm(signum, frame):
        raise TraceTimeout(f"no result after {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return function()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def settle() -> None:
    """Start each timed step from a quiet machine: collect garbage, then idle briefly.

    Without it a step that follows local loading (torch's worker threads still
    spinning, on a 2-core box) or a trace's aftermath runs measurably slower.
    """
    gc.collect()
    time.sleep(SETTLE)


def remote_trace(model) -> tuple[float, Any]:
    started = time.perf_counter()
    with model.trace(PROMPT, remote=True):
        logits = model.lm_head.output[:, -1].save()
    return time.perf_counter() - started, logits


def local_trace(model) -> Any:
    with model.trace(PROMPT):
        logits = model.lm_head.output[:, -1].save()
    return logits


def check_same(remote: Any, local: Any, case: str) -> None:
    import torch

    if not isinstance(remote, torch.Tensor):
        raise AssertionError(f"{case}: logits came back as {type(remote).__name__}")
    if remote.shape != local.shape or remote.dtype != local.dtype:
        raise AssertionError(
            f"{case}: logits are {remote.dtype}{tuple(remote.shape)} remotely, "
            f"{local.dtype}{tuple(local.shape)} locally"
        )
    if not torch.allclose(remote, local, rtol=1e-5, atol=1e-6):
        difference = (remote - local).abs().max().item()
        raise AssertionError(f"{case}: logits differ from local (max abs diff {difference:g})")


def time_load(load: Callable[[], Any]) -> float:
    settle()
    started = time.perf_counter()
    model = load()
    elapsed = time.perf_counter() - started
    del model
    return elapsed


# --- the table ------------------------------------------------------------------------


def fmt_s(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.2f}"


def print_table(rows: list[tuple[str, list[float]]], repeats: int, hot_median: float) -> None:
    headers = ["case", "median s", "min s", "max s", "x HOT"]
    table = []
    for case, samples in rows:
        median = statistics.median(samples)
        table.append(
            [
                case,
                fmt_s(median),
                fmt_s(min(samples)),
                fmt_s(max(samples)),
                f"{median / hot_median:.1f}x" if hot_median > 0 else "-",
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            [cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))]
        )

    print(line(headers))
    print(line(["-" * w for w in widths]))
    for cells in table:
        print(line(cells))


# --- main ---------------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for a level or a trace"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    from nnhost.testing import ServerProcess, free_port, point_client_at

    root = Path(tempfile.mkdtemp(prefix="nnhost-hotswap-"))
    port = free_port()
    server_url = f"http://127.0.0.1:{port}"

    # The client's environment, set before nnsight / huggingface_hub are imported.
    point_client_at(server_url, API_KEY, root)

    server: Optional[ServerProcess] = None
    admin: Optional[Admin] = None
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.logging.set_verbosity_error()

        from nnhost.models.tiny import TinyGPT2Spec, build_tiny_gpt2

        spec = TinyGPT2Spec(n_layer=6, n_embd=256, n_head=8, n_positions=256, vocab_size=512)
        server_hf_home = root / "server-hf"
        print(f"building {REPO_ID} {spec} in {server_hf_home} ...", flush=True)
        snapshot = build_tiny_gpt2(REPO_ID, hf_home=server_hf_home, spec=spec)
        weights = sum(f.stat().st_size for f in snapshot.iterdir() if f.name.endswith(".safetensors"))
        print(f"  weights on disk: {weights / (1 << 20):.1f} MiB", flush=True)

        print(f"starting nnhost on {server_url} ...", flush=True)
        server = ServerProcess(
            [REPO_ID],
            data_dir=root / "server-data",
            hf_home=server_hf_home,
            api_key=API_KEY,
            port=port,
        )
        server.start(timeout=args.timeout)
        admin = Admin(server_url, API_KEY, REPO_ID)
        admin.wait("HOT", running=True, timeout=args.timeout)

        import nnsight
        from nnsight import LanguageModel

        nnsight.CONFIG.APP.REMOTE_LOGGING = False

        # Local references: the first load in this process (imports, first use
        # of the GPT-2 classes), untimed in the table.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first_hf = time_load(lambda: transformers.AutoModelForCausalLM.from_pretrained(str(snapshot)))
            started = time.perf_counter()
            local_model = LanguageModel(str(snapshot), dispatch=True)
            first_nnsight = time.perf_counter() - started
            remote_model = LanguageModel(REPO_ID)
        for parameter in local_model._module.parameters():
            parameter.requires_grad_(False)
        reference = local_trace(local_model)

        def trace(case: str) -> float:
            settle()
            elapsed, logits = with_deadline(args.timeout, lambda: remote_trace(remote_model))
            check_same(logits, reference, case)
            return elapsed

        print("warming up (HOT) ...", flush=True)
        for _ in range(WARMUP):
            trace("warm-up")
        print("  remote logits match local (allclose)", flush=True)

        samples: dict[str, list[float]] = {
            "HOT": [],
            "WARM": [],
            "COLD": [],
            "local from_pretrained": [],
            "local LanguageModel": [],
        }
        to_cold: list[float] = []  # evict -> /status COLD
        to_warm: list[float] = []  # deploy warm -> /status WARM RUNNING
        server_loads: list[str] = []  # the worker's "Loaded in ..." after COLD / WARM
        notes: list[str] = []

        def ensure_cold() -> None:
            answer = admin.evict()
            if answer.get("target") != "COLD":
                raise EndpointError(f"POST /admin/evict answered {answer}, expected target COLD")
            elapsed, _ = admin.wait("COLD", running=False, timeout=args.timeout)
            to_cold.append(elapsed)

        def ensure_warm() -> None:
            entries = admin.entries()
            started = time.perf_counter()
            answer = admin.deploy("warm")
            if answer.get("target") == "HOT":
                # /admin/deploy does not demote a HOT model; go via COLD.
                if not notes:
                    notes.append(
                        f"POST /admin/deploy level=warm on the HOT model answered {answer} "
                        f"(/status before: {[(e['deployment_level'], e['application_state']) for e in entries]}); "
                        "so WARM is reached by evict -> COLD -> deploy warm."
                    )
                ensure_cold()
                started = time.perf_counter()
                answer = admin.deploy("warm")
            if answer.get("target") != "WARM":
                raise EndpointError(f"POST /admin/deploy level=warm answered {answer}, expected target WARM")
            _, entries = admin.wait("WARM", running=True, timeout=args.timeout)
            to_warm.append(time.perf_counter() - started)
            server_loads.append(f"WARM: {loaded_in(entries) or '-'}")

        for round_ in range(1, args.repeats + 1):
            print(f"round {round_}/{args.repeats}:", flush=True)

            admin.wait("HOT", running=True, timeout=args.timeout)
            samples["HOT"].append(trace("HOT"))
            print(f"  HOT   {samples['HOT'][-1]:.3f}s", flush=True)

            ensure_cold()
            samples["COLD"].append(trace("COLD"))
            _, entries = admin.wait("HOT", running=True, timeout=args.timeout)
            server_loads.append(f"COLD: {loaded_in(entries) or '-'}")
            print(f"  COLD  {samples['COLD'][-1]:.3f}s  (evict -> COLD shown in {to_cold[-1]:.3f}s)", flush=True)

            ensure_warm()
            samples["WARM"].append(trace("WARM"))
            print(
                f"  WARM  {samples['WARM'][-1]:.3f}s  (deploy warm -> WARM RUNNING shown in {to_warm[-1]:.3f}s)",
                flush=True,
            )

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                samples["local from_pretrained"].append(
                    time_load(lambda: transformers.AutoModelForCausalLM.from_pretrained(str(snapshot)))
                )
                samples["local LanguageModel"].append(
                    time_load(lambda: LanguageModel(str(snapshot), dispatch=True))
                )
            print(
                f"  local from_pretrained {samples['local from_pretrained'][-1]:.3f}s, "
                f"LanguageModel {samples['local LanguageModel'][-1]:.3f}s",
                flush=True,
            )

        hot_median = statistics.median(samples["HOT"])
        print()
        print(
            f"Client wall time of one small remote trace by the model's level, and in-process "
            f"load times of the same {weights / (1 << 20):.1f} MiB model; {args.repeats} runs each:"
        )
        print_table(
            [
                ("HOT   (trace)", samples["HOT"]),
                ("WARM  (trace)", samples["WARM"]),
                ("COLD  (trace, deploys on demand)", samples["COLD"]),
                ("local AutoModelForCausalLM.from_pretrained", samples["local from_pretrained"]),
                ("local LanguageModel(dispatch=True)", samples["local LanguageModel"]),
            ],
            args.repeats,
            hot_median,
        )
        print()
        print(f"first (untimed) local load: from_pretrained {first_hf:.3f}s, "
              f"LanguageModel {first_nnsight:.3f}s")
        print(f"evict -> /status COLD: median {statistics.median(to_cold):.3f}s over {len(to_cold)}")
        print(f"deploy warm -> /status WARM RUNNING (server loads into host memory): "
              f"median {statistics.median(to_warm):.3f}s over {len(to_warm)}")
        print(f"worker's own load times from /status: {'; '.join(server_loads)}")
        for note in notes:
            print(f"note: {note}")
        print("every remote result matched the local trace (allclose rtol=1e-5, atol=1e-6)")
        return 0
    except EndpointError as error:
        print(f"\nendpoint misbehaved: {error}", file=sys.stderr)
        if server is not None:
            print(f"server log tail:\n{server.log_tail()}", file=sys.stderr)
        return 2
    except TraceTimeout as error:
        print(f"\ntrace timed out: {error}", file=sys.stderr)
        if admin is not None:
            try:
                print(f"/status entries: {admin.entries()}", file=sys.stderr)
            except Exception as status_error:  # noqa: BLE001 - report whatever happened
                print(f"/status also failed: {status_error!r}", file=sys.stderr)
        if server is not None:
            print(f"server log tail:\n{server.log_tail()}", file=sys.stderr)
        return 2
    finally:
        if admin is not None:
            admin.close()
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

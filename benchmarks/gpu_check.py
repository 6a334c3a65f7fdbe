"""One check of nnhost on a GPU: parity, escapes that touch the GPU, and timings.

Run it on a GPU host from a fresh checkout (see docs/gpus.md)::

    python3 benchmarks/gpu_check.py                     # cuda:0, a ~1B GPT-2 in bf16
    python3 benchmarks/gpu_check.py --device cpu --small   # the same script end to end on the CPU

It builds its model itself (random weights, a GPT-2 shape, saved in the HF
cache layout under a temp dir; nothing is downloaded, ``HF_HUB_OFFLINE=1`` for
the server), serves it with a real ``nnhost serve`` with containment on (the
default) from a ``[[model]]`` entry with ``device`` and ``dtype``, drives it
with the real nnsight client, and prints:

1. parity: each of a dozen programs, remote against the same code run locally
   on the same device with the same weights;
2. escapes that touch the GPU: writes into a weight (direct, through
   ``.data``), reading uninitialised device memory after another job filled
   it, keeping a device tensor on the model for the next request; after each,
   a normal request must still match the local run;
3. the per-job guard time (the worker's ``meta["integrity_seconds"]``);
4. time to result with the model COLD, WARM and HOT, beside a plain
   ``from_pretrained`` load onto the device;
5. small-trace latency, remote against local;
6. what each ready job process holds: its private host memory and (on CUDA,
   from ``nvidia-smi``) its device memory.

All of it runs once per execution design in ``--executions`` (by default
``auto``, which is in-process on CUDA and fork on the CPU, then ``mapped``:
each job's process forked from a template without weights, mapping the
host's by handle), each with a server of its own.

Each step has ``--step-timeout`` seconds: past them the check prints the
server's log and what each of its processes is doing, and stops that server.

It exits 1 if any parity or escape check fails, 0 otherwise, and 0 with
"no GPU: skipped" where the device is CUDA and ``torch.cuda.is_available()``
is false. Programs come from ``tests/parity_programs.py`` (``PROGRAMS``, a
list of ``(name, function(model, remote) -> dict)``) when that file exists,
else from the dozen below.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

REPO_ID = "nnhost-gpu-check/gpt2"
API_KEY = "nnh_gpucheck_" + "g" * 40
PROMPT = "The Eiffel Tower is in the city of"
OTHER = "The Colosseum is in the city of"
#: About 1.06B parameters: 24 blocks of width 1920 (GPT-2's shape, a small vocabulary).
LARGE = dict(n_layer=24, n_embd=1920, n_head=16, n_positions=1024, vocab_size=512)
#: About 150M parameters: a check that fits a short loan of a GPU with time to spare.
MEDIUM = dict(n_layer=12, n_embd=1024, n_head=16, n_positions=1024, vocab_size=512)
SMALL = dict(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=512)
SIZES = {"large": LARGE, "medium": MEDIUM, "small": SMALL}


# --- the programs compared remote against local ------------------------------------------


def p_logits(model, remote):
    with model.trace(PROMPT, remote=remote):
        logits = model.lm_head.output.save()
    return {"logits": logits}


def p_hidden_states(model, remote):
    with model.trace(PROMPT, remote=remote):
        first = model.transformer.h[0].output.save()
        last = model.transformer.h[-1].output.save()
    return {"first": first, "last": last}


def p_zero_a_position(model, remote):
    with model.trace(PROMPT, remote=remote):
        model.transformer.h[0].output[:, -1, :] = 0
        logits = model.lm_head.output.save()
    return {"logits": logits}


def p_scale_the_mlp(model, remote):
    with model.trace(PROMPT, remote=remote):
        model.transformer.h[0].mlp.output = model.transformer.h[0].mlp.output * 2
        logits = model.lm_head.output[:, -1].save()
    return {"logits": logits}


def p_module_input(model, remote):
    with model.trace(PROMPT, remote=remote):
        mlp_input = model.transformer.h[0].mlp.input.save()
    return {"mlp_input": mlp_input}


def p_attention_output(model, remote):
    with model.trace(PROMPT, remote=remote):
        attention = model.transformer.h[0].attn.output[0].save()
    return {"attention": attention}


def p_invokes(model, remote):
    with model.trace(remote=remote) as tracer:
        with tracer.invoke(PROMPT):
            first = model.lm_head.output[:, -1].save()
        with tracer.invoke(OTHER):
            second = model.lm_head.output[:, -1].save()
    return {"first": first, "second": second}


def p_session_patch(model, remote):
    with model.session(remote=remote):
        with model.trace(PROMPT):
            eiffel = model.transformer.h[-1].output[:, -1, :]
        with model.trace(OTHER):
            model.transformer.h[-1].output[:, -1, :] = eiffel
            patched = model.lm_head.output.save()
    return {"patched": patched}


def p_generate(model, remote):
    with model.generate(PROMPT, max_new_tokens=3, remote=remote) as tracer:
        output = tracer.result.save()
    return {"output": output}


def p_generate_steps(model, remote):
    with model.generate(OTHER, max_new_tokens=3, remote=remote) as tracer:
        tokens = list().save()
        for step in tracer.iter[:]:  # noqa: B007 (nnsight's loop over generation steps)
            tokens.append(model.lm_head.output[0, -1].argmax(dim=-1))
    return {"tokens": tokens}


def p_gradient(model, remote):
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].output
        hidden.requires_grad = True
        loss = model.lm_head.output[0, -1, 5]
        with loss.backward():
            grad = hidden.grad.save()
    return {"grad": grad}


def p_steering(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].output
        direction = torch.ones(hidden.shape[-1], device=hidden.device, dtype=hidden.dtype)
        model.transformer.h[0].output = hidden + direction
        norms = model.transformer.h[-1].output.norm(dim=-1).save()
        top = model.lm_head.output[0, -1].argmax().save()
    return {"top": top, "norms": norms}


OWN_PROGRAMS: list[tuple[str, Callable]] = [
    (function.__name__[2:], function)
    for function in (
        p_logits, p_hidden_states, p_zero_a_position, p_scale_the_mlp, p_module_input,
        p_attention_output, p_invokes, p_session_patch, p_generate, p_generate_steps,
        p_gradient, p_steering,
    )
]


def programs() -> tuple[str, list[tuple[str, Callable]]]:
    path = ROOT / "tests" / "parity_programs.py"
    if path.is_file():
        sys.path.insert(0, str(path.parent))
        try:
            from parity_programs import PROGRAMS  # type: ignore

            return "tests/parity_programs.py", list(PROGRAMS)
        except Exception as error:  # the file's interface changed: say so, use our own
            print(f"  (tests/parity_programs.py not usable: {error!r}; using the script's own)")
    return "benchmarks/gpu_check.py's own", OWN_PROGRAMS


# --- comparing --------------------------------------------------------------------------


def to_cpu(value: Any) -> Any:
    """The same value with every tensor in it on the CPU, every container's type kept."""
    import copy
    import types

    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, torch.Size) or isinstance(value, (str, bytes, int, float, type(None))):
        return value
    if isinstance(value, dict):
        moved = copy.copy(value)
        for key in value:
            moved[key] = to_cpu(value[key])
        return moved
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)._make(to_cpu(item) for item in value)
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(item) for item in value)
    if hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, types.FunctionType)):
        moved = copy.copy(value)
        moved.__dict__.update({key: to_cpu(item) for key, item in vars(value).items()})
        return moved
    return value


def same(remote: Any, local: Any) -> Optional[str]:
    """None when equal, else what differs.

    The suite's own type-exact comparison (``tests/compare.py``) when the tests
    are beside this script, so a GPU run checks what the CPU suite checks;
    otherwise a structural one of our own (tensors close for their dtype).
    """
    try:
        from compare import assert_identical  # type: ignore
    except ImportError:
        return _same_structure(remote, local)
    try:
        assert_identical(remote, local)
    except AssertionError as error:
        return str(error).splitlines()[0] if str(error) else "differs"
    return None


def _same_structure(remote: Any, local: Any) -> Optional[str]:
    import torch

    if isinstance(local, torch.Tensor):
        if not isinstance(remote, torch.Tensor):
            return f"{type(remote).__name__} is not a tensor"
        try:
            torch.testing.assert_close(remote, local)
        except AssertionError as error:
            return str(error).splitlines()[0]
        return None
    if isinstance(local, dict):
        if not isinstance(remote, dict) or remote.keys() != local.keys():
            return "different keys"
        for key in local:
            problem = _same_structure(remote[key], local[key])
            if problem:
                return f"{key}: {problem}"
        return None
    if isinstance(local, (list, tuple)):
        if len(remote) != len(local):
            return "different lengths"
        for index, (a, b) in enumerate(zip(remote, local)):
            problem = _same_structure(a, b)
            if problem:
                return f"[{index}]: {problem}"
        return None
    return None if remote == local else f"{remote!r} != {local!r}"


def same_failure(local_error: Exception, run_remote: Callable[[], Any]) -> tuple[bool, str]:
    """Whether the remote run fails as the local one did (a program this device or dtype cannot run)."""
    first = (str(local_error).strip().splitlines() or [""])[0]
    try:
        run_remote()
    except Exception as remote_error:
        if first and first in str(remote_error):
            return True, f"fails here locally too, with the same error ({type(local_error).__name__}: {first[:90]})"
        return False, f"local: {type(local_error).__name__}: {first[:90]}; remote: {str(remote_error).strip()[:200]}"
    return False, f"local fails ({type(local_error).__name__}: {first[:90]}) but the remote run completed"


# --- escapes ------------------------------------------------------------------------------


def e_write_into_a_weight(model, remote):
    with model.trace(PROMPT, remote=remote):
        model.transformer.h[0].mlp.c_fc.weight[:] = 0


def e_zero_a_weight_through_data(model, remote):
    with model.trace(PROMPT, remote=remote):
        model.lm_head.weight.data.zero_()


def e_fill_device_memory(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        device = model.transformer.h[0].output.device
        for size in (4096, 1 << 16, 1 << 20, 1 << 24):
            for _ in range(3):
                block = torch.full((size,), 1234.5, device=device)
                block.mul_(1.0)
        done = model.lm_head.output[0, 0, 0].save()


def e_read_uninitialised_memory(model, remote):
    import nnsight
    import torch

    with model.trace(PROMPT, remote=remote):
        device = model.transformer.h[0].output.device
        found = []
        for size in (4096, 1 << 16, 1 << 20, 1 << 24):
            for tensor in (
                torch.empty(size, device=device),
                torch.empty_like(torch.zeros(size, device=device)),
                torch.zeros(1, device=device).new_empty(size),
                torch.empty_strided((size,), (1,), device=device),
                torch.zeros(1, device=device).resize_(size + 1)[1:],
            ):
                found.append((int((tensor.float() == 1234.5).sum()), int(torch.count_nonzero(tensor))))
        found = nnsight.save(found)
    return found


def e_keep_a_tensor(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        device = model.transformer.h[0].output.device
        model._module.transformer.kept = torch.full((1 << 20,), 7.0, device=device)
        done = model.lm_head.output[0, 0, 0].save()


def e_find_the_kept_tensor(model, remote):
    import nnsight

    with model.trace(PROMPT, remote=remote):
        kept = nnsight.save(hasattr(model._module.transformer, "kept"))
    return kept


# --- the driver's handles, alone ----------------------------------------------------------

HANDLE_CHILD = r"""
import sys, time
started = time.perf_counter()
import torch
from nnhost.execution.weights.cuda_handles import DeviceImage
fd, size, count, device = (int(value) for value in sys.argv[1:5])
torch.cuda.set_device(device)
image = DeviceImage.open(device, fd, size)
values = image.tensor(0, count * 4).view(torch.float32)
expected = torch.arange(count, dtype=torch.float32, device=values.device)
print("opened", f"{(time.perf_counter() - started) * 1000:.0f}ms", flush=True)
print("read", "equal" if torch.equal(values, expected) else "DIFFERENT", flush=True)
try:
    values.fill_(0)
    torch.cuda.synchronize()
    print("write", "completed", flush=True)
except Exception as error:
    print("write", "refused", type(error).__name__, str(error).splitlines()[0][:160], flush=True)
"""


def check_handles(args: Any, check: "Check") -> None:
    """The CUDA facts the mapped design rests on, outside any server.

    The host-side allocation is exported as a descriptor; a fresh process (in
    a PID namespace of its own where ``unshare`` allows it) imports it, maps it
    read-only, reads it, and tries to write; then the exporter reads its own
    copy again, which must be unchanged.
    """
    import shutil
    import subprocess

    import torch

    from nnhost.execution.weights.cuda_handles import DeviceImage

    print("\n=== the driver's handles (cuda_handles), alone ===", flush=True)
    device = torch.device(args.device).index or 0
    count = 1 << 22
    try:
        torch.zeros(1, device=args.device)
        image = DeviceImage.create(device, count * 4)
        values = image.tensor(0, count * 4).view(torch.float32)
        values.copy_(torch.arange(count, dtype=torch.float32, device=args.device))
        torch.cuda.synchronize()
        fd = image.export()
    except Exception as error:
        check.record("create, map and export an allocation", False, f"{type(error).__name__}: {error}")
        return
    check.record("create, map and export an allocation", True, f"{image.size} bytes")
    # A job's process is PID 1 of its own namespace with that namespace's /proc
    # (the driver fails to start under another namespace's: error 304).
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"] if shutil.which("unshare") else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    runs = [("in a PID namespace of its own", prefix)] if prefix else [("plain", [])]
    for label, command in runs:
        done = subprocess.run(
            [*command, sys.executable, "-c", HANDLE_CHILD, str(fd), str(image.size), str(count), str(device)],
            pass_fds=[fd], capture_output=True, text=True, timeout=120, env=env)
        lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
        print(f"  child ({label}): exit {done.returncode}; " + "; ".join(f"{k} {v}" for k, v in lines.items()))
        if done.returncode and "read" not in lines:
            print("  " + done.stderr.strip()[-1200:].replace("\n", "\n  "))
        check.record(f"a child ({label}) imports the descriptor and reads the weights",
                     lines.get("read") == "equal", lines.get("read", "no read"))
        check.record(f"a child's write ({label}) does not complete",
                     not lines.get("write", "").startswith("completed"), lines.get("write", f"exit {done.returncode}"))
        unchanged = torch.equal(values, torch.arange(count, dtype=torch.float32, device=args.device))
        check.record(f"the exporter's copy is unchanged after the child's write ({label})", unchanged)
    os.close(fd)


# --- the run --------------------------------------------------------------------------------


class Check:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def record(self, name: str, ok: bool, detail: str = "") -> None:
        print(f"  {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        if not ok:
            self.failures.append(name)


class Watchdog:
    """Each step of a design's check has ``seconds``; past them, say what hangs and stop the server.

    An H200 once spent a whole loan on one request that never ended, with
    nothing printed. Now a step that overruns prints the server's log and what
    each of its processes is doing (`replicas.stuck`), then stops the server,
    so the client's call fails and the check goes on to the next design.
    """

    def __init__(self, seconds: float, server: Any) -> None:
        import threading

        self.seconds, self.server = seconds, server
        self.step_name, self.deadline, self.fired = "", float("inf"), False
        self._done = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def step(self, name: str) -> None:
        if self.fired:
            raise RuntimeError(f"the server was stopped: {self.step_name!r} overran {self.seconds:g} s")
        self.step_name, self.deadline = name, time.monotonic() + self.seconds

    def close(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(1.0):
            if time.monotonic() > self.deadline and not self.fired:
                self.fired = True
                print(f"\nTIMEOUT: {self.step_name!r} took over {self.seconds:g} s; the server's log:", flush=True)
                print(self.server.log_tail(150), flush=True)
                print("\nwhat each of the server's processes is doing:", flush=True)
                try:
                    from nnhost.replicas.stuck import process_snapshot

                    for pid in [self.server.process.pid, *_tree(self.server.process.pid)]:
                        print("  " + process_snapshot(pid, depth=0), flush=True)
                except Exception:
                    traceback.print_exc()
                self.server.stop()


def timed(function: Callable[[], Any], device: str) -> tuple[float, Any]:
    import torch

    gc.collect()
    started = time.perf_counter()
    value = function()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started, value


def build(hf_home: Path, size: str, dtype: str) -> Path:
    import torch

    from nnhost.models.tiny import TinyGPT2Spec, build_gpt2, save_to_cache

    model, tokenizer = build_gpt2(TinyGPT2Spec(**SIZES[size]))
    model = model.to(getattr(torch, dtype))
    snapshot = save_to_cache(model, tokenizer, REPO_ID, hf_home)
    del model
    gc.collect()
    return snapshot


def check_design(args: Any, execution: str, root: Path, url: str, port: int, hf_home: Path,
                 snapshot: Path, dtype: str, check: "Check") -> None:
    """Serve the model with ``execution`` and run every check against it."""
    import torch

    from nnhost.testing import ServerProcess

    print(f"\n=== execution = {execution!r} ===", flush=True)
    data_dir = root / f"data-{execution}"
    data_dir.mkdir()
    (data_dir / "nnhost.toml").write_text(
        f"job_start_timeout = {args.step_timeout / 2:g}\n"
        f'[[model]]\nrepo_id = "{REPO_ID}"\ndevice = "{args.device}"\ndtype = "{dtype}"\n'
    )
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "NNHOST_EXECUTION": execution}
    server = ServerProcess([], data_dir=data_dir, hf_home=hf_home, api_key=API_KEY, port=port, env=env)
    watchdog = Watchdog(args.step_timeout, server)
    try:
        started = time.perf_counter()
        server.start(timeout=args.start_timeout)
        entry = next(iter(server.status()["deployments"].values()))
        print(f"server up in {time.perf_counter() - started:.1f}s: {entry.get('description', '')}")
        layers = entry.get("containment") or {}
        print(f"containment: {layers}", flush=True)
        if execution == "mapped" and layers.get("execution") != "mapped":
            check.record("the mapped design is what runs", False, f"/status says {layers.get('execution')!r}")

        import nnsight
        from nnsight import LanguageModel
        from nnsight.intervention.backends.remote import RemoteBackend, RemoteError

        nnsight.CONFIG.APP.REMOTE_LOGGING = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            remote_model = LanguageModel(REPO_ID)
            local_model = LanguageModel(str(snapshot), dispatch=True, dtype=getattr(torch, dtype))
        local_model._module.to(args.device)
        for parameter in local_model._module.parameters():
            parameter.requires_grad_(False)
        parameters = sum(p.numel() for p in local_model._module.parameters())
        print(f"model: {parameters / 1e6:.1f}M parameters, {dtype}, on {args.device}")

        source, listed = programs()
        print(f"\nparity: {len(listed)} programs ({source}), remote against local on {args.device}")
        reference = None
        for name, program in listed:
            watchdog.step(name)
            try:
                local = to_cpu(program(local_model, False))
            except Exception as error:
                # Written for the CPU (numpy on a device tensor, an op bf16 lacks):
                # what the server owes is the same error the local run gives.
                check.record(name, *same_failure(error, lambda program=program: program(remote_model, url)))
                continue
            try:
                remote = to_cpu(program(remote_model, url))
                problem = same(remote, local)
                check.record(name, problem is None, problem or "")
                if name == "logits":
                    reference = local
            except Exception as error:
                check.record(name, False, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        if reference is None:
            reference = to_cpu(p_logits(local_model, False))

        def still_serving(after: str) -> None:
            watchdog.step(f"after {after}")
            server.wait_running(600)
            problem = same(to_cpu(p_logits(remote_model, url)), reference)
            check.record(f"after {after}: a normal request matches local", problem is None, problem or "")

        print("\nescapes that touch the device")
        for name, escape in (("write into a weight", e_write_into_a_weight),
                             ("zero a weight through .data", e_zero_a_weight_through_data)):
            watchdog.step(name)
            try:
                escape(remote_model, url)
                check.record(f"{name}: refused", False, "the request completed")
            except RemoteError as error:
                check.record(f"{name}: refused", True, str(error).strip().splitlines()[-1][:120])
            still_serving(name)
        watchdog.step("uninitialised device memory")
        # Another user fills it: one user's later jobs may run in the process
        # that ran her earlier ones (`jobs_per_process`), another's never do.
        nnsight.CONFIG.API.APIKEY = server.user_keys(1, "filler")[0]
        try:
            e_fill_device_memory(remote_model, url)
        finally:
            nnsight.CONFIG.API.APIKEY = API_KEY
        found = e_read_uninitialised_memory(remote_model, url)
        pattern, nonzero = sum(p for p, _ in found), sum(n for _, n in found)
        check.record("uninitialised device memory never shows another user's values",
                     pattern == 0, f"{pattern} elements of the other user's in {len(found)} allocations")
        if args.device != "cpu":
            # Blank on an accelerator (its caching allocator keeps freed blocks); on
            # the CPU a job's own process has nothing of another's (`fresh_memory`).
            check.record("uninitialised device memory after another job filled it is blank",
                         nonzero == 0, f"{nonzero} non-zero elements in {len(found)} allocations")
        watchdog.step("a kept tensor")
        try:
            e_keep_a_tensor(remote_model, url)
        except RemoteError:
            pass
        kept = e_find_the_kept_tensor(remote_model, url)
        check.record("a device tensor kept on the model is gone for the next request", kept is False,
                     f"hasattr(transformer, 'kept') is {kept}")
        still_serving("the escapes")

        print("\ntimings")
        watchdog.step("timings")
        guard, remote_times, local_times = [], [], []
        for _ in range(args.repeats + 1):
            backend = RemoteBackend(remote_model.to_model_key(), host=url)
            t0 = time.perf_counter()
            with remote_model.trace(PROMPT, backend=backend):
                logits = remote_model.lm_head.output[:, -1].save()
            remote_times.append(time.perf_counter() - t0)
            guard.append((backend.meta or {}).get("integrity_seconds", float("nan")))
            elapsed, _ = timed(lambda: p_logits(local_model, False), args.device)
            local_times.append(elapsed)
        remote_ms = statistics.median(remote_times[1:]) * 1000
        local_ms = statistics.median(local_times[1:]) * 1000
        print(f"  per-job guard: {statistics.median(guard[1:]) * 1000:.2f} ms (median of {args.repeats})")
        print(f"  small trace: remote {remote_ms:.1f} ms, local {local_ms:.1f} ms, "
              f"ratio {remote_ms / local_ms:.2f}x, overhead {remote_ms - local_ms:.1f} ms")

        from hotswap import Admin

        admin = Admin(url, API_KEY, REPO_ID)
        levels: dict[str, float] = {}
        watchdog.step("COLD, WARM and HOT")
        try:
            levels["HOT"], _ = timed(lambda: p_logits(remote_model, url), "cpu")
            admin.evict()
            admin.wait("COLD", running=False, timeout=300)
            levels["COLD"], _ = timed(lambda: p_logits(remote_model, url), "cpu")
            admin.wait("HOT", running=True, timeout=300)
            admin.evict()
            admin.wait("COLD", running=False, timeout=300)
            admin.deploy("warm")
            admin.wait("WARM", running=True, timeout=600)
            levels["WARM"], _ = timed(lambda: p_logits(remote_model, url), "cpu")
            admin.wait("HOT", running=True, timeout=300)
        finally:
            admin.close()
        from transformers import AutoModelForCausalLM

        def plain_load():
            model = AutoModelForCausalLM.from_pretrained(str(snapshot), dtype=getattr(torch, dtype))
            return model.to(args.device)

        print("  " + ready_job_memory(args.device, server))
        load_seconds, loaded = timed(plain_load, args.device)
        del loaded
        print("  time to result: " + ", ".join(f"{k} {v:.2f}s" for k, v in levels.items())
              + f"; plain from_pretrained onto {args.device}: {load_seconds:.2f}s")
        still_serving("the level changes")
    except Exception:
        traceback.print_exc()
        print(server.log_tail(60))
        check.failures.append(f"the check itself ({execution})")
    finally:
        watchdog.close()
        server.stop()


def ready_job_memory(device: str, server: Any) -> str:
    """What each ready job process holds: device memory (nvidia-smi) and its resident host memory."""
    import subprocess

    pids = _tree(server.process.pid)
    jobs = [pid for pid in pids if " -m nnhost.execution.host.template" in _parent_command(pid)]
    host_kib = []
    for pid in jobs:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as file:
                for line in file:
                    if line.startswith(("Private_Dirty:", "Private_Clean:")):
                        host_kib.append(int(line.split()[1]))
        except OSError:
            pass
    text = f"ready job processes (children of the template): {len(jobs)}"
    if host_kib:
        text += f", private host memory {sum(host_kib) / 1024 / max(1, len(jobs)):.0f} MiB each"
    if device.startswith("cuda") and jobs:
        try:
            listed = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=20).stdout
            used = {int(p): int(m) for p, m in (line.split(",") for line in listed.strip().splitlines() if line)}
            on_device = [used[pid] for pid in jobs if pid in used]
            text += f", device memory {on_device} MiB"
        except (OSError, ValueError, subprocess.SubprocessError) as error:
            text += f", device memory unknown ({error})"
    return text


def _tree(root_pid: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    parents[int(entry)] = int(file.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = [], [root_pid]
    while frontier:
        current = frontier.pop()
        children = [pid for pid, parent in parents.items() if parent == current]
        found += children
        frontier += children
    return found


def _parent_command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as file:
            parent = int(file.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{parent}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ValueError, IndexError):
        return ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--small", action="store_true", help="a tiny model (for the CPU): --size small")
    parser.add_argument("--size", choices=sorted(SIZES), default="large",
                        help="the model: large ~1B, medium ~150M, small (tiny, for the CPU)")
    parser.add_argument("--start-timeout", type=float, default=600,
                        help="seconds a server may take to serve its model before the check gives up on it")
    parser.add_argument("--step-timeout", type=float, default=240,
                        help="seconds one step (a program, an escape, the timings) may take before the "
                        "check prints what hangs and stops that design's server")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--repeats", type=int, default=5, help="timed small traces per side")
    parser.add_argument("--executions", default="auto,mapped",
                        help="execution designs to check, one server each (auto: in-process on CUDA, fork on the CPU)")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no GPU: skipped (torch.cuda.is_available() is false; "
              "run with --device cpu --small to exercise the script on the CPU)")
        return 0
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    from nnhost.testing import free_port, point_client_at

    root = Path(tempfile.mkdtemp(prefix="nnhost-gpu-check-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    point_client_at(url, API_KEY, root)
    hf_home = root / "server-hf"
    started = time.perf_counter()
    snapshot = build(hf_home, "small" if args.small else args.size, dtype)
    print(f"built {REPO_ID} in {time.perf_counter() - started:.1f}s at {snapshot}", flush=True)
    check = Check()
    if args.device.startswith("cuda"):
        check_handles(args, check)
    for execution in args.executions.split(","):
        check_design(args, execution, root, url, port, hf_home, snapshot, dtype, check)
    print()
    if check.failures:
        print(f"FAILED: {len(check.failures)} check(s): {', '.join(check.failures)}")
        return 1
    print("all parity and escape checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

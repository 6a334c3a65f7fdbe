"""Running one request against a loaded model, inside a replica process.

The mechanism, from the nnsight client's side of the contract: the payload is a
pickled tracer plus the traced block's source; `RequestModel.deserialize`
rebuilds the tracer against *our* live model (the model's persistent ids
resolve to the loaded modules), and ``tracer.execute`` runs the block exactly as
the user's own machine would have. What the block marked with ``.save()`` is
found in the tracer's frame afterwards, by identity in this thread's saved set.

Around that core this module adds what a shared server needs: the request's
model environment applied and then restored, ``print()`` turned into LOG events
as it happens, a time limit that interrupts even a pure-Python loop, the cost of
the run (`meta`), the result written straight to the result store, and errors
reported with the user's own traceback rather than ours (`memory_meter`,
`result_writing` and `tracebacks` hold the parts that are not the run itself).

It must never talk to the network, the database or the API: it receives a
`JobSpec` and reports through a callback.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from ..events import JobEvent, JobSpec
from ..guard.process_state import fresh_random_state
from ..nnsight_api import current
from ..python_layer.sandbox import SandboxViolation
from .capture import capture_stdout
from .memory_meter import MemoryMeter
from .result_writing import serialize_result, write_all, write_atomically
from .tracebacks import user_traceback

if TYPE_CHECKING:
    from ..guard.integrity import ModelGuard
    from ..unpickling.unpickler import RestrictedUnpickler
    from ..weights.cpu import WeightImage

Emit = Callable[[JobEvent], None]


class JobTimeout(BaseException):
    """Raised in the job's thread when its time limit passes.

    A BaseException, so a user's ``except Exception`` cannot swallow it; a user
    who catches BaseException is dealt with by the replica, which kills the
    process once a grace period has passed.
    """


class UserError(Exception):
    """A failure to report to the user as is (no traceback of ours)."""


# --- time limit -------------------------------------------------------------


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `JobTimeout` in this (main) thread after ``seconds``."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise JobTimeout()

    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- isolation between requests ----------------------------------------------


@contextmanager
def forget_sources() -> Iterator[None]:
    """Run a job with none of the previous jobs' source code in memory.

    nnsight reads a traced block's source by file name and line, and caches the
    text (``SOURCES``) and the compiled block (``BLOCKS``) for the life of the
    process. On a client that is one program; on a server it is every user's
    program under whatever file names they happen to have, so a second request
    from ``/home/me/script.py`` would find the first one's source, or another
    user's block compiled at the same line. The deserializer registers each
    request's source in ``linecache``; we drop all three before and after each job.
    """
    import linecache

    def clear() -> None:
        current().forget()
        linecache.clearcache()

    clear()
    try:
        yield
    finally:
        clear()


# --- the run ----------------------------------------------------------------


class Runner:
    """Runs requests one at a time against one loaded nnsight model."""

    #: In the fork design, the weights sealed in read-only memory (set by `worker.secure`).
    weight_image: Optional[WeightImage]

    def __init__(self, model: Any, unpickler: Optional[type[RestrictedUnpickler]] = None) -> None:
        self.model = model
        self.unpickler = unpickler
        #: Undoes what a job changed on the shared model (`integrity.ModelGuard`).
        self.guard: Optional[ModelGuard] = None
        #: The fork design's snapshot, taken in the host before any fork, with
        #: which a job's process puts the model back between two jobs of its
        #: owner, after each result is out (`job.process`); None elsewhere.
        self.owner_guard: Optional[ModelGuard] = None
        #: This process runs one job and exits (a job's own process sets it after the fork).
        self.sole_job = False
        self.persistent_objects = model._remoteable_persistent_objects()
        # What every request starts from; a request's env is undone afterwards
        # so it can never leak into the next user's run.
        self.default_env = current().get_env(model)
        if unpickler is not None:
            from ..guard.fresh_memory import prepare

            prepare()  # storage constructors patched before any user code can reach them
            from ..python_layer.sandbox import preload_lazy_submodules

            # Before the guard's snapshot (taken after this), and so that a
            # fresh worker's first np.median costs what a warm one's does.
            preload_lazy_submodules(unpickler.policy)

    def run(self, spec: JobSpec, emit: Emit) -> bool:
        """Run ``spec`` to completion, reporting RUNNING, LOG, then COMPLETED or ERROR.

        Returns False when the job left the model changed in a way the guard
        could not undo: the worker must then be replaced before the next job.
        """
        final: list[JobEvent] = []

        def hold_final(event: JobEvent) -> None:
            # The final event waits until the model has been checked, so that
            # it can say what the job changed and what was undone.
            (final.append if event.final else emit)(event)

        fresh_random_state()
        try:
            with forget_sources():
                self._run(spec, hold_final)
        finally:
            for fd in (spec.payload_fd, spec.result_fd):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        intact = True
        notice = ""
        if self.guard is not None:
            checked = time.perf_counter()
            report = self.guard.restore()
            for event in final:
                if event.meta is not None:
                    event.meta["integrity_seconds"] = round(time.perf_counter() - checked, 6)
            intact = not report.fatal
            if report.fatal:
                notice = (
                    " Your request changed the shared model in a way that could not be "
                    f"undone ({'; '.join(report.fatal)}); its worker is being restarted."
                )
            elif report.restored:
                notice = (
                    " Your request changed the shared model; the change was undone "
                    f"({'; '.join(report.restored[:3])}). Changes to the model do not "
                    "carry over to other requests."
                )
        for event in final:
            event.description += notice
            emit(event)
        if self.unpickler is not None:
            from ..guard.fresh_memory import release_cached_memory

            release_cached_memory()
        if intact and self.guard is not None:
            # The result has gone out: the full weight check costs no one latency.
            intact = not self.guard.verify_weights()
        return intact

    def _run(self, spec: JobSpec, emit: Emit) -> None:
        started = time.perf_counter()
        meta: dict[str, Any] = {}
        adapter: Optional[str] = None
        try:
            # The env first: a request for an adapted model names the adapter's
            # modules, which exist only once the adapter is in the tree.
            adapter = self._unpack_adapter(spec)
            self._apply_env(spec.env, adapter)
            reading = time.perf_counter()
            tracer = self._deserialize(spec, adapter is not None)
            meta["deserialize_seconds"] = round(time.perf_counter() - reading, 6)
            emit(JobEvent(spec.job_id, "RUNNING", "Running your request."))
            with MemoryMeter() as meter:
                execution_started = time.perf_counter()
                try:
                    saves = self._execute(tracer, spec, emit)
                finally:
                    meta["runtime"] = round(time.perf_counter() - execution_started, 6)
            meta.update(meter.report())
            writing = time.perf_counter()
            data = self._serialize(saves, spec.compress)
            meta["result_bytes"] = len(data)
            if spec.max_result_bytes and len(data) > spec.max_result_bytes:
                raise UserError(
                    f"The result is {len(data):,} bytes, over this server's limit of "
                    f"{spec.max_result_bytes:,} bytes. Save less: only the tensors you "
                    "need, sliced to the positions you need (e.g. "
                    "`model.layer.output[:, -1].save()`)."
                )
            if spec.result_fd >= 0:
                write_all(spec.result_fd, data)
            else:
                write_atomically(spec.result_path, data)
            meta["serialize_seconds"] = round(time.perf_counter() - writing, 6)
            meta["total_seconds"] = round(time.perf_counter() - started, 6)
            names = ", ".join(sorted(saves)) or "nothing"
            emit(
                JobEvent(
                    spec.job_id,
                    "COMPLETED",
                    f"Completed in {meta['runtime']:.3f}s; saved {names} "
                    f"({len(data):,} bytes).",
                    meta=meta,
                    result_size=len(data),
                )
            )
        except JobTimeout:
            meta["total_seconds"] = round(time.perf_counter() - started, 6)
            emit(
                JobEvent(
                    spec.job_id,
                    "ERROR",
                    f"Your request exceeded this server's time limit of "
                    f"{spec.time_limit:g} seconds and was stopped. Shorten it (fewer "
                    "tokens, fewer invokes) or split it into several requests.",
                    meta=meta,
                )
            )
        except UserError as error:
            meta["total_seconds"] = round(time.perf_counter() - started, 6)
            emit(JobEvent(spec.job_id, "ERROR", str(error), meta=meta))
        except BaseException as error:
            # BaseException too: a request that raises SystemExit must not stop the worker.
            meta["total_seconds"] = round(time.perf_counter() - started, 6)
            description = user_traceback(error)
            if isinstance(error, MemoryError) or "can't allocate memory" in str(error):
                description += (
                    "\nYour request ran out of the memory this server allows one request. "
                    "Use fewer or shorter inputs, or save less."
                )
            emit(JobEvent(spec.job_id, "ERROR", description, meta=meta))
        finally:
            self._restore_env()
            if adapter is not None:
                import shutil

                shutil.rmtree(adapter, ignore_errors=True)

    def _unpack_adapter(self, spec: JobSpec) -> Optional[str]:
        from ..handoff import unpack_adapter

        if spec.env and spec.env.get("peft") is not None and not spec.adapter_fds:
            raise UserError(
                "This replica cannot apply a PEFT adapter: the server handed it no adapter files."
            )
        try:
            return unpack_adapter(spec)
        except OSError as error:
            import errno

            if error.errno == errno.ENOSPC:
                raise UserError(
                    "The PEFT adapter is larger than the scratch space a request has on this "
                    "server (its scratch_bytes setting)."
                ) from None
            raise UserError(f"The server could not hand your request its PEFT adapter: {error}") from None

    def _deserialize(self, spec: JobSpec, tree_changed: bool = False) -> Any:
        if spec.payload_fd >= 0:
            with os.fdopen(os.dup(spec.payload_fd), "rb") as file:
                blob = file.read()
        else:
            with open(spec.payload_path, "rb") as file:
                blob = file.read()
        unpickler = self.unpickler
        if unpickler is not None and spec.client_python:
            unpickler = unpickler.for_client(spec.client_python)
        # An adapter rebuilt the envoy tree: its modules are persistent objects too.
        objects = self.model._remoteable_persistent_objects() if tree_changed else self.persistent_objects
        try:
            return current().deserialize(blob, objects, spec.compress, unpickler)
        except SandboxViolation as error:
            raise UserError(str(error)) from error
        except RecursionError as error:
            raise UserError(
                "The server could not read your request: it is nested too deeply."
            ) from error
        except Exception as error:
            raise UserError(
                "The server could not read your request: "
                f"{type(error).__name__}: {error}. "
                + _deserialize_hint(error)
            ) from error

    def _serialize(self, saves: dict[str, Any], compress: bool) -> bytes:
        try:
            return serialize_result(saves, compress)
        except (JobTimeout, MemoryError):
            raise
        except Exception as error:
            culprits = []
            for name, value in saves.items():
                try:
                    serialize_result({name: value}, False)
                except Exception:
                    culprits.append(f"{name} ({type(value).__name__})")
            raise UserError(
                "Your saved values could not be sent back: "
                f"{', '.join(culprits) or 'one of them'} cannot be serialized "
                f"({type(error).__name__}: {error}). Save tensors, numbers, strings, "
                "or lists and dicts of them."
            ) from error

    def _apply_env(self, env: dict[str, Any], adapter: Optional[str] = None) -> None:
        # The adapter is applied from the copy of its files the server handed
        # over (the same files the Hub id names in the server's cache).
        applied = {**(env or {}), "peft": adapter} if adapter is not None else (env or {})
        try:
            current().set_env(self.model, applied)
        except Exception as error:
            raise UserError(f"Could not apply the request's model settings {env!r}: {error}") from None

    def _restore_env(self) -> None:
        # Not caught: the default env was accepted at load time, so failing now
        # means a model we cannot vouch for; the worker dies and is restarted
        # rather than serve the next user from it.
        current().set_env(self.model, self.default_env)

    def _memory(self) -> Any:
        """Blank allocations and refused weight writes, for contained jobs (`fresh_memory`)."""
        if self.unpickler is None:
            return nullcontext()
        from ..guard.fresh_memory import job_memory

        protected = self.guard.protected_storages() if self.guard is not None else frozenset()
        return job_memory(protected, self.sole_job)

    def _execute(self, request: Any, spec: JobSpec, emit: Emit) -> dict[str, Any]:
        def log(line: str) -> None:
            emit(JobEvent(spec.job_id, "LOG", line))

        with capture_stdout(log, spec.max_log_lines), time_limit(spec.time_limit), self._memory():
            return current().execute(request)


def _deserialize_hint(error: BaseException) -> str:
    if isinstance(error, ModuleNotFoundError):
        return (
            "Code from a module that is not installed on the server must be sent "
            "with the request: call `nnsight.register(your_module)` before tracing."
        )
    if "zstd" in type(error).__module__ or "Zstd" in type(error).__name__:
        return "The payload is not valid zstd data although the request said `compress`."
    return "Check that your nnsight version matches the server's (`nnsight.compare()`)."

"""How much memory a job added while it ran: the ``peak_memory_bytes`` of its cost.

`MemoryMeter` is entered around a job's execution by `runner`; its report goes
into the final event's ``meta``. It only measures: it must never limit, free or
touch the job's memory (the limits are `containment`'s and `cgroups`'), and it
must never block the job (the sampling thread is a daemon that only reads).

On the CPU a thread samples the resident set size while the job runs. A job's
process (`job.process`) starts that thread before it says it is ready
(`prepare`): starting a thread waits until the new one runs, which on a busy
machine took milliseconds of every request's path. Elsewhere (a warm-up, one
process for every job) a meter starts a thread of its own, as it always did.
The kernel's own peak (``VmHWM``) cannot stand in: it cannot be reset from
inside a contained process, so it would include whatever came before the job.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional


def resident_bytes() -> int:
    """This process's resident set size (``statm``: O(1))."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


#: How often the resident set size is read while a job runs (seconds).
INTERVAL = 0.005


class Sampler:
    """One thread that reads the resident set size while it is running, and sleeps otherwise."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.pid = os.getpid()  # a thread does not survive a fork: a child needs its own
        self._interval = interval
        self._running = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._peak = 0
        self._thread = threading.Thread(target=self._sample, daemon=True, name="nnhost-memory-meter")
        self._thread.start()

    def _sample(self) -> None:
        while not self._stopped.is_set():
            self._running.wait()
            rss = resident_bytes()
            with self._lock:
                if self._running.is_set():
                    self._peak = max(self._peak, rss)
            self._stopped.wait(self._interval)

    def begin(self, baseline: int) -> None:
        with self._lock:
            self._peak = baseline
        self._running.set()

    def end(self, last: int) -> int:
        """Stop sampling; the peak seen since `begin`, ``last`` included."""
        self._running.clear()
        with self._lock:
            return max(self._peak, last)

    def close(self) -> None:
        """Stop the thread (a meter that started its own does, when it is done)."""
        self._stopped.set()
        self._running.set()  # wake it, so that it sees it is stopped
        self._thread.join()


_prepared: Optional[Sampler] = None


def prepare() -> None:
    """Start this process's sampling thread now, before a job waits for it (a job's process)."""
    global _prepared
    if _prepared is None or _prepared.pid != os.getpid():
        _prepared = Sampler()


class MemoryMeter:
    """Peak memory a job adds on top of what was resident before it started.

    On CUDA the allocator keeps the exact peak; on the CPU a sampling thread
    reads the resident set size, which is what the machine actually pays.
    """

    def __init__(self, interval: float = INTERVAL) -> None:
        self._interval = interval
        self._sampler: Optional[Sampler] = None
        self._own = False
        self.baseline = 0
        self.peak = 0
        self.cuda_baseline = 0
        self.cuda = False

    def __enter__(self) -> "MemoryMeter":
        import torch

        # Only where this process already uses a device: asking whether CUDA is
        # available starts its driver, which no child forked after can use (the
        # mapped design's template runs this warm-up and then forks every job).
        self.cuda = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.cuda_baseline = torch.cuda.memory_allocated()
        self.baseline = self.peak = resident_bytes()
        prepared = _prepared
        if prepared is not None and prepared.pid == os.getpid():
            self._sampler, self._own = prepared, False
        else:
            self._sampler, self._own = Sampler(self._interval), True
        self._sampler.begin(self.baseline)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._sampler is None:
            return
        self.peak = self._sampler.end(resident_bytes())
        if self._own:
            self._sampler.close()
        self._sampler = None

    def report(self) -> dict[str, int]:
        meta = {"peak_memory_bytes": max(0, self.peak - self.baseline)}
        if self.cuda:
            import torch

            meta["peak_gpu_memory_bytes"] = max(
                0, torch.cuda.max_memory_allocated() - self.cuda_baseline
            )
        return meta

"""How much memory a job added while it ran: the ``peak_memory_bytes`` of its cost.

`MemoryMeter` is entered around a job's execution by `runner`; its report goes
into the final event's ``meta``. It only measures: it must never limit, free or
touch the job's memory (the limits are `containment`'s and `cgroups`'), and it
must never block the job (the sampling thread is a daemon that only reads).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemoryMeter:
    """Peak memory a job adds on top of what was resident before it started.

    On CUDA the allocator keeps the exact peak; on the CPU a sampling thread
    reads the resident set size, which is what the machine actually pays.
    """

    def __init__(self, interval: float = 0.005) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
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
        self.baseline = self.peak = _rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    def report(self) -> dict[str, int]:
        meta = {"peak_memory_bytes": max(0, self.peak - self.baseline)}
        if self.cuda:
            import torch

            meta["peak_gpu_memory_bytes"] = max(
                0, torch.cuda.max_memory_allocated() - self.cuda_baseline
            )
        return meta

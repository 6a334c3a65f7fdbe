"""The memory a job adds, measured without starting a thread on the job's path.

A job's process starts its sampling thread before it says it is ready
(`memory_meter.prepare`); a meter in that process then uses it, so the job
waits for no thread to start. Anywhere else a meter starts a thread of its own
and stops it when it is done. Either way the report is the peak resident set
size above what was resident when the job began.
"""

from __future__ import annotations

import threading

import numpy as np

from nnhost.execution.job import memory_meter
from nnhost.execution.job.memory_meter import MemoryMeter

MIB = 1 << 20


def _meter_around_an_allocation(mib: int) -> tuple[MemoryMeter, int]:
    """A meter around writing ``mib`` MiB (still held when it ends); the threads seen inside."""
    with MemoryMeter() as meter:
        threads = threading.active_count()
        held = np.ones(mib * MIB // 8)  # written, so resident
    assert held.sum() == held.size
    return meter, threads


def test_a_prepared_process_measures_a_job_without_starting_a_thread():
    memory_meter.prepare()
    before = threading.active_count()
    meter, inside = _meter_around_an_allocation(64)
    assert inside == before  # the prepared thread did the sampling
    assert meter.report()["peak_memory_bytes"] >= 60 * MIB
    # Measured again, it reports this block's own peak, not the last one's.
    with MemoryMeter() as again:
        pass
    assert again.report()["peak_memory_bytes"] < 32 * MIB
    assert threading.active_count() == before


def test_a_meter_without_a_prepared_thread_starts_its_own_and_stops_it(monkeypatch):
    monkeypatch.setattr(memory_meter, "_prepared", None)
    before = threading.active_count()
    meter, inside = _meter_around_an_allocation(64)
    assert inside == before + 1
    assert threading.active_count() == before  # stopped when the meter ended
    assert meter.report()["peak_memory_bytes"] >= 60 * MIB


def test_a_forked_child_does_not_use_its_parents_thread(monkeypatch):
    # A thread does not survive fork: a sampler whose process is not this one is not used.
    stale = memory_meter.Sampler()
    monkeypatch.setattr(stale, "pid", stale.pid + 1)
    monkeypatch.setattr(memory_meter, "_prepared", stale)
    before = threading.active_count()
    meter, inside = _meter_around_an_allocation(8)
    assert inside == before + 1
    stale.close()

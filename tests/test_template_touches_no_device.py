"""The mapped design's template never starts a device's driver: every job's process is forked from it.

A GPU's driver started in a process is not usable in its forked children
(torch refuses: "Cannot re-initialize CUDA in forked subprocess"). The
template imports torch, builds the tree on the meta device and runs a warm-up
request on stand-ins on the CPU; if any of that asked torch whether CUDA is
available, every job's process on a GPU host would fail as it binds its
weights. Here each of torch's calls that starts the driver is a tripwire, and
the template's warm-up runs on a machine without a GPU all the same.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from nnhost.execution.mapped_weights import stand_ins
from nnhost.execution.runner import Runner
from nnhost.execution.worker import warm_up

#: What starts the driver (or asks it a question that does): torch.cuda's and the runtime's entry points.
TRIPWIRES = ("is_available", "device_count", "init", "synchronize", "current_device", "_lazy_init",
             "reset_peak_memory_stats", "memory_allocated", "max_memory_allocated", "empty_cache")


@pytest.fixture
def tripped(monkeypatch):
    calls: list[str] = []
    for name in TRIPWIRES:
        def trip(*args, _name=name, **kwargs):
            calls.append(_name)
            raise AssertionError(f"torch.cuda.{_name} was called")
        monkeypatch.setattr(torch.cuda, name, trip)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: calls.append("_cuda_getDeviceCount") or 0,
                        raising=False)
    return calls


def test_the_templates_warm_up_never_starts_a_device(tripped, test_snapshot):
    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LanguageModel(str(test_snapshot), dispatch=False)  # on the meta device, as the template builds it
    model.dispatched = True
    with stand_ins(model):
        problem = warm_up(model, Runner(model))
    assert problem is None, problem
    assert tripped == []

"""The mapped design's template never starts a device's driver: every job's process is forked from it.

A GPU's driver started in a process is not usable in its forked children
(torch refuses: "Cannot re-initialize CUDA in forked subprocess"). The
template imports torch, builds the tree on the meta device, imports the
allowed libraries, hardens them and runs a warm-up request on stand-ins on
the CPU; if any of that asked torch whether CUDA is available, every job's
process on a GPU host would fail as it binds its weights. Here, in a fresh
interpreter, each of torch's calls that starts the driver is a tripwire, and
the template's steps (all but the OS layers, which need a process of their
own) run on a machine without a GPU all the same.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, sys, warnings
import torch

calls = []
def tripwire(name):
    def trip(*args, **kwargs):
        calls.append(name)
        raise RuntimeError(f"torch.cuda.{name} was called")
    return trip

# What starts the driver (or asks it a question that does).
for name in ("is_available", "device_count", "init", "synchronize", "current_device", "_lazy_init",
             "reset_peak_memory_stats", "memory_allocated", "max_memory_allocated", "empty_cache",
             "get_device_properties", "mem_get_info"):
    setattr(torch.cuda, name, tripwire(name))
if hasattr(torch._C, "_cuda_getDeviceCount"):  # a CUDA build (its presence is how torch tells)
    torch._C._cuda_getDeviceCount = tripwire("_cuda_getDeviceCount")

from nnsight import LanguageModel
from nnhost.execution.weights.mapped import stand_ins
from nnhost.execution.policy import WorkerPolicy
from nnhost.execution.host.worker import python_layer
from nnhost.execution.job.warm_up import warm_up

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    model = LanguageModel(sys.argv[1], dispatch=False)  # on the meta device, as the template builds it
model.dispatched = True
runner = python_layer(model, WorkerPolicy())  # as worker.secure builds it, before the OS layers
with stand_ins(model):
    problem = warm_up(model, runner)
print(json.dumps({"calls": calls, "problem": problem}))
"""


def test_the_templates_steps_never_start_a_device(test_snapshot):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(test_snapshot)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["problem"] is None, found["problem"]
    assert found["calls"] == []

"""Each device's memory budget: what the operator set, else what this machine holds.

`memory_budgets` is what the controller's placement (`placement.DeviceBudgets`)
fits replicas into: the host defaults to 80% of this machine's memory, a GPU
to 90% of what the device says is free.

A GPU's memory budget defaults to what the device itself says is free
(``torch.cuda.mem_get_info``). Asking from the API process would create a CUDA
context there that holds a few hundred MiB of every GPU for the server's whole
life, and the API process has no other use for CUDA; so a short-lived child
process asks and prints the answer. It never loads a model or runs user code.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Optional, Sequence

from ..config import Settings
from ..models.catalog import Catalog
from ..units import parse_size

log = logging.getLogger("nnhost")

_PROBE = """
import json, sys, torch
out = {}
if torch.cuda.is_available():
    for name in json.loads(sys.argv[1]):
        index = int(name.split(":", 1)[1]) if ":" in name else 0
        if index < torch.cuda.device_count():
            free, total = torch.cuda.mem_get_info(index)
            out[name] = [free, total]
print(json.dumps(out))
"""


def gpu_memory(devices: Sequence[str], timeout: float = 120.0) -> dict[str, int]:
    """Free bytes of each CUDA device in ``devices`` that exists (empty when none does)."""
    names = [d for d in devices if d.startswith("cuda")]
    if not names:
        return {}
    try:
        result = subprocess.run(
            [sys.executable, "-c", _PROBE, json.dumps(names)],
            capture_output=True, text=True, timeout=timeout,
        )
        answer = json.loads(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        answer = {}
    missing = [name for name in names if name not in answer]
    if missing:
        log.warning("no memory figure for %s: those devices have no budget", ", ".join(missing))
    return {name: int(free) for name, (free, _total) in answer.items()}


def memory_budgets(settings: Settings, catalog: Optional[Catalog] = None) -> dict[str, int]:
    """Bytes per device: ``memory_budget`` where set; the host 80% of this machine's memory,
    and a GPU the catalog uses 90% of its free memory (`gpu_memory`)."""
    budgets = {device: parse_size(size) for device, size in settings.memory_budget.items()}
    if "cpu" not in budgets:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            budgets["cpu"] = int(total * 0.8)
        except (ValueError, OSError):
            pass
    wanted = sorted({d for spec in (catalog or ()) for d in spec.placement_devices()} - set(budgets))
    gpus = [d for d in wanted if d.startswith("cuda")]
    if gpus:
        for device, free in gpu_memory(gpus).items():
            budgets[device] = int(free * 0.9)
    return budgets

"""benchmarks/gpu_check.py runs here: it skips cleanly without a GPU, and its
``--device cpu --small`` mode goes end to end (parity, escapes, timings) on the CPU.

GPU time is scarce, so the script must be known to run before it reaches one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for name in ("NDIF_HOST", "NDIF_API_KEY", "HF_ENDPOINT", "HF_HOME", "NNSIGHT_CONFIG"):
        env.pop(name, None)  # the script sets up its own client
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a GPU: the script would run")
def test_without_a_gpu_it_says_so_and_exits_0():
    result = run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("no GPU: skipped"), result.stdout


def test_the_whole_check_runs_on_the_cpu_with_a_small_model():
    result = run("--device", "cpu", "--small", "--repeats", "2")
    output = result.stdout
    assert result.returncode == 0, output + result.stderr[-3000:]
    assert "all parity and escape checks passed" in output
    assert output.count("  ok   ") >= 12 + 7 and "FAIL" not in output
    for figure in ("per-job guard:", "small trace: remote", "time to result: HOT", "plain from_pretrained"):
        assert figure in output, output

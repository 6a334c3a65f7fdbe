"""`make bench ARGS=--quick` runs to completion here, as CI must be able to run it.

The suite's figures are not asserted (these machines are shared and noisy);
what is checked is that every section ran, each figure beside its
comparison, and that the JSON table says what the printed one does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECTIONS = {"overhead", "throughput", "download", "first LOG", "levels"}


def test_quick_bench_runs_every_section(tmp_path):
    table = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "suite.py"), "--quick", "--json", str(table)],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    data = json.loads(table.read_text())
    assert data["quick"] is True and data["clients"] == [1, 4, 16]
    rows = data["rows"]
    assert {row["section"] for row in rows} == SECTIONS
    for row in rows:
        assert row["nnhost"] > 0, row
        if row["against"]:
            assert row["comparison"] > 0 and row["ratio"] > 0, row
        assert row["measure"] in run.stdout
    throughput = [row["measure"] for row in rows if row["section"] == "throughput"]
    for clients in (1, 4, 16):
        assert sum(measure.startswith(f"{clients} clients,") for measure in throughput) == 2

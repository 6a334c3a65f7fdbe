#!/usr/bin/env bash
# On a GPU host with no network: install the wheels gpu_wheels.sh put in .whl/
# (into /tmp/site, nothing system-wide) and run the GPU check. Arguments go to
# benchmarks/gpu_check.py. Exits with the check's status.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec python3 benchmarks/gpu_check.py "$@"

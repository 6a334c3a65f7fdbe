#!/usr/bin/env bash
# Download, into .whl/, the wheels benchmarks/gpu_check.py needs on a GPU host that
# has no network: Python 3.12, manylinux x86-64, already holding a CUDA torch,
# transformers, safetensors, tokenizers, numpy, accelerate, httpx, jinja2, sympy,
# einops and the like. What it lacks is nnhost's server and nnsight's client side.
#
#   bash benchmarks/gpu_wheels.sh          # here, with network
#   bash benchmarks/gpu_run.sh             # there, from the checkout with .whl/ beside it
#
# Versions are the ones the test suite runs against. --no-deps: the list is the
# whole closure of what the host lacks, so nothing else is fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=(
  nnsight==0.8.1 greenlet==3.5.6 websocket-client==1.9.2 zstandard==0.25.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0
  fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2 uvicorn==0.55.0
  websockets==17.4 python-multipart==0.0.34
  argon2-cffi==25.1.0 argon2-cffi-bindings==26.2.0 cffi==2.1.1 pycparser==3.12
  pydantic-settings==2.16.3 python-dotenv==1.2.4 prometheus_client==0.26.0
  SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3
)
PLATFORMS=()
for platform in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
    manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_34_x86_64 \
    manylinux_2_35_x86_64 manylinux_2_31_x86_64; do
  PLATFORMS+=(--platform "$platform")
done
mkdir -p .whl
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
if [ -n "$exclude" ] && ! grep -qx '/.whl/' "$exclude" 2>/dev/null; then
  mkdir -p "$(dirname "$exclude")" && echo '/.whl/' >> "$exclude"
fi
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
du -sh .whl
ls .whl

"""A client of an nnsight version the server does not serve is refused, in its own client, with what to do.

Each client here is the real nnsight of its version from PyPI, in its own
environment (`make clients`: a venv over .venv's packages with only that
nnsight added), running a small trace with ``remote=True`` against a real
server. 0.5.15 is the older version refused: like 0.6 and 0.7 it opens a
Socket.IO session first (`api.socketio_front`), so it reaches its request and
shows the refusal rather than "Connection error"; unlike them it ships its
functions as bytecode, which no restricted reader can check, so no runtime
serves it. A version newer than any served is the 0.8.1 client reporting a
later release. (0.8.0, 0.7.0 and 0.6.3 are served, each by its runtime:
`test_runtimes`.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import TEST_REPO

from nnhost.client_versions import served_client_versions

CLIENTS = Path(__file__).resolve().parents[1] / ".clients"

PROGRAM = """
import sys, warnings
warnings.simplefilter("ignore")
import nnsight
from nnsight import LanguageModel
if len(sys.argv) > 2:  # play a release newer than any served
    import nnsight.intervention.backends.remote as remote
    remote._NNSIGHT_VERSION = sys.argv[2]
model = LanguageModel(sys.argv[1])
try:
    with model.trace("The Eiffel Tower is in the city of", remote=True):
        out = model.lm_head.output.save()
except BaseException as error:
    print("REFUSED", nnsight.__version__, type(error).__name__, str(error), sep="|")
else:
    print("SERVED", nnsight.__version__, tuple(out.shape), sep="|")
"""


def client_python(version: str) -> Path:
    python = CLIENTS / f"nnsight-{version}" / "bin" / "python"
    if not (python.parent.parent / ".installed").exists():
        message = f"no nnsight {version} client environment: run `make clients`"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return python


def run_client(python: "Path | str", *extra: str) -> list[str]:
    """Run PROGRAM as a user's script (a file: some versions read the trace's source) in ``python``."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "trace_remotely.py"
        script.write_text(PROGRAM)
        done = subprocess.run(
            [str(python), str(script), TEST_REPO, *extra], capture_output=True, text=True, timeout=600,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith(("REFUSED|", "SERVED|"))]
    assert lines, f"the client printed no outcome (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return lines[-1].split("|")


@pytest.mark.parametrize("version", ["0.5.15"])
def test_an_unserved_client_sees_the_versions_served_and_the_install_that_works(server, version):
    outcome, reported, kind, text = run_client(client_python(version))
    served = served_client_versions()
    assert outcome == "REFUSED" and reported == version
    assert "Connection error" not in text, text
    assert f"your client runs nnsight {version}" in text, text
    assert f"pip install nnsight=={served[0]}" in text and all(name in text for name in served), text


def test_a_newer_client_than_any_served_is_refused_too(server):
    outcome, _, _, text = run_client(sys.executable, "0.9.0")
    assert outcome == "REFUSED"
    assert "your client runs nnsight 0.9.0" in text and f"pip install nnsight=={served_client_versions()[0]}" in text


def test_the_served_client_is_served(server):
    outcome, reported, shape = run_client(sys.executable)
    assert (outcome, reported) == ("SERVED", served_client_versions()[0]) and shape.startswith("(1, ")


def test_status_lists_the_client_versions_served(server):
    assert server.status()["client_versions"] == list(served_client_versions())

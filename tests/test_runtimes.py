"""Each served client version runs with its own nnsight, on the host's one copy of the weights.

The clients are the real nnsight of each version from PyPI, each in its own
environment (`make clients`); the server's other runtimes are built by `make
install` (`nnhost.runtimes`). A job of a client of another version than the
server's own runs in a process forked from that version's template, which
maps the host's weights (`replicas.runtimes`).

What is shown here, in both execution designs:
- the nnsight a trace's job runs with (the module printed in the trace, a
  LOG, names its file) is the client's, for the server's own version and
  for each other runtime;
- every parity program gives, with a client of another version, what the
  same client gives locally (`client_versions/run_parity.py`);
- the runtime's job processes map the host's weights (the same memfd) and
  hold no copy of them;
- a runtime idle for ``runtime_idle_seconds`` stops its template, and the
  next job of that version starts it again;
- ``/env`` answers with the runtime a request names;
- where one process runs every job (trusted mode), a client of another
  version is told why it cannot be served, in its own exception.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import API_KEY, TEST_REPO
from parity_programs import PROGRAMS
from process_tree import descendants, processes
from test_client_versions import client_python

from nnhost.client_versions import own_version, socketio_era
from nnhost.runtimes import RUNTIME_EXTRAS, RUNTIME_VERSIONS, installed
from nnhost.testing import ServerProcess

HERE = Path(__file__).resolve().parent
PARITY = HERE / "client_versions" / "run_parity.py"
#: The parity programs that send a class defined in the user's script.
SCRIPT_CLASS_PROGRAMS = {name for name, _ in PROGRAMS if name.startswith("script_")}

VERSION_PROGRAM = """
import sys, warnings
warnings.simplefilter("ignore")
import nnsight
from nnsight import CONFIG, LanguageModel
CONFIG.APP.REMOTE_LOGGING = True
model = LanguageModel(sys.argv[1])
with model.trace("The Eiffel Tower is in the city of", remote=True):
    print("JOB-NNSIGHT", nnsight)  # the module's repr names the file it was imported from
    out = model.lm_head.output.save()
local = LanguageModel(sys.argv[2], dispatch=True)
with local.trace("The Eiffel Tower is in the city of"):
    expected = local.lm_head.output.save()
print("CLIENT-NNSIGHT", nnsight.__version__, bool((out == expected).all()))
"""


def runtime_versions() -> list[str]:
    """The runtimes this checkout must have: `make install` builds every one nnhost has."""
    missing = [version for version in RUNTIME_VERSIONS if version not in installed()]
    if missing:
        message = f"no runtime for nnsight {', '.join(missing)}: run `make install`"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return list(RUNTIME_VERSIONS)


def python_of(version: str) -> str:
    import sys

    return sys.executable if version == own_version() else str(client_python(version))


def run_script(python: str, server: ServerProcess, script: Path, *args: str,
               timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a client environment, a user's laptop pointed at ``server``."""
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "NDIF_HOST": server.url, "NDIF_API_KEY": API_KEY,
               "HF_ENDPOINT": f"{server.url}/hub", "HF_HOME": f"{folder}/hf",
               "NNSIGHT_CONFIG": f"{folder}/nnsight.yaml"}
        return subprocess.run([python, str(script), *args], capture_output=True, text=True, timeout=timeout,
                              env=env)


@pytest.fixture(scope="module", params=["fork", "mapped"])
def runtime_server(request, root, server_hf_home, test_snapshot):
    runtime_versions()
    process = ServerProcess(
        [TEST_REPO],
        data_dir=root / f"runtime-server-{request.param}",
        hf_home=server_hf_home,
        api_key=API_KEY,
        env={"NNHOST_EXECUTION": request.param},
    )
    process.start()
    yield process
    process.stop()


def job_nnsight(server: ServerProcess, version: str, snapshot: Path) -> tuple[str, str, bool]:
    """The nnsight the trace's job ran with, the client's, and whether the result equals the local one.

    The job's is read from where its nnsight module was imported from: a
    runtime's own folder, or the server's environment (its own version).
    """
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "trace_remotely.py"  # a file: nnsight reads the trace's source
        script.write_text(VERSION_PROGRAM)
        done = run_script(python_of(version), server, script, TEST_REPO, str(snapshot))
    job = [own_version() if "nnhost-runtimes" not in line else re.findall(r"nnhost-runtimes/nnsight-([^/]+)/", line)[0]
           for line in re.findall(r"JOB-NNSIGHT (<module .*)", done.stdout)]
    client = re.findall(r"CLIENT-NNSIGHT (\S+) (True|False)", done.stdout)
    assert job and client, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return job[-1], client[-1][0], client[-1][1] == "True"


@pytest.mark.parametrize("version", [own_version(), *RUNTIME_VERSIONS])
def test_a_trace_runs_with_its_clients_own_nnsight(runtime_server, version, test_snapshot):
    job, client, equal = job_nnsight(runtime_server, version, test_snapshot)
    assert (job, client) == (version, version)
    assert equal, "the remote logits differ from the same client's local run"


@pytest.mark.parametrize("version", RUNTIME_VERSIONS)
def test_every_parity_program_gives_what_the_same_client_gives_locally(runtime_server, version, test_snapshot):
    done = run_script(str(client_python(version)), runtime_server, PARITY, runtime_server.url, TEST_REPO,
                      str(test_snapshot),
                      timeout=1800)
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(PROGRAMS), f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert {report["client"] for report in reports} == {version}
    unsendable = {report["program"] for report in reports if report["outcome"].startswith("unsendable: ")}
    failed = {report["program"]: report["outcome"] for report in reports
              if report["outcome"] != "ok" and report["program"] not in unsendable}
    assert not failed, "\n\n".join(f"{name}: {why}" for name, why in failed.items())
    # Only 0.6's and 0.7's serializer refuses programs, and only those that send a
    # class of the user's script (it has no source for their generated methods).
    assert unsendable <= (SCRIPT_CLASS_PROGRAMS if socketio_era(version) else set()), unsendable


def test_env_answers_with_the_runtime_a_client_names(runtime_server):
    import httpx

    for version in [own_version(), *runtime_versions()]:
        env = httpx.get(f"{runtime_server.url}/env", headers={"nnsight-version": version}, timeout=30).json()
        assert env["packages"]["nnsight"] == version
    plain = httpx.get(f"{runtime_server.url}/env", timeout=30).json()  # what the 0.8 clients ask
    assert plain["packages"]["nnsight"] == own_version()


NNTERP_PROGRAM = """
import sys, warnings
warnings.simplefilter("ignore")
from nnsight import CONFIG, LanguageModel
CONFIG.APP.REMOTE_LOGGING = True
model = LanguageModel(sys.argv[1])
with model.trace("The Eiffel Tower is in the city of", remote=True):
    import nnterp
    print("JOB-NNTERP", nnterp)  # names the file it was imported from
    out = model.lm_head.output.save()
print("SHAPE", tuple(out.shape))
"""


@pytest.mark.parametrize("version", [version for version in RUNTIME_VERSIONS
                                     if any(extra.startswith("nnterp") for extra in RUNTIME_EXTRAS.get(version, ()))])
def test_nnterp_imports_in_a_trace_where_the_runtimes_nnsight_lets_it(runtime_server, version):
    """nnterp 1.3.0 imports with the 0.6/0.7 layout: their runtimes install it, and a trace may import it."""
    import httpx

    env = httpx.get(f"{runtime_server.url}/env", headers={"nnsight-version": version}, timeout=30).json()
    assert env["packages"].get("nnterp") == "1.3.0"
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "uses_nnterp.py"
        script.write_text(NNTERP_PROGRAM)
        done = run_script(python_of(version), runtime_server, script, TEST_REPO)
    found = re.findall(r"JOB-NNTERP <module 'nnterp' from '([^']+)'", done.stdout)
    assert found and f"nnhost-runtimes/nnsight-{version}/" in found[-1], done.stdout[-3000:] + done.stderr[-3000:]
    assert "SHAPE (1, 8, " in done.stdout


def runtime_templates(server: ServerProcess, version: str) -> list[int]:
    assert server.process is not None
    table = processes()
    marker = f"nnsight-{version}/bin/python -m nnhost.execution.host.template"
    found = [pid for pid in descendants(server.process.pid, table) if marker in table[pid][1]]
    return [pid for pid in found if table[pid][0] not in found]  # its job processes are its forks


def _weight_maps(pid: int) -> set[str]:
    """The inodes of the sealed weight memfds ``pid`` maps (`weights.pack_storages` names them)."""
    try:
        with open(f"/proc/{pid}/maps") as file:
            lines = file.read().splitlines()
    except OSError:
        return set()
    return {line.split()[4] for line in lines if "memfd:nnhost-weights" in line}


def test_a_runtimes_job_processes_map_the_hosts_weights(runtime_server, test_snapshot):
    version = runtime_versions()[0]
    assert job_nnsight(runtime_server, version, test_snapshot)[0] == version
    templates = runtime_templates(runtime_server, version)
    assert len(templates) == 1, templates
    table = processes()
    jobs = descendants(templates[0], table)
    assert jobs, "the runtime keeps no job process ready after a job"
    hosts = [pid for pid in descendants(runtime_server.process.pid, table)
             if "-m nnhost.execution.host.host" in table[pid][1]]
    host_weights = set().union(*(_weight_maps(pid) for pid in hosts))
    assert host_weights, "the host maps no sealed weights"
    # /status shows what the runtime holds of its own: a process or two, far from the weights.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = [entry.get("runtimes") or {} for entry in runtime_server.status()["deployments"].values()]
        if any(version in runtimes for runtimes in held):
            break
        time.sleep(0.5)
    assert any(runtimes.get(version, 0) > 0 for runtimes in held), held
    # The parameters' image is the host's own memfd; the buffers' is a private copy per
    # export (some forward passes write them), a few KiB here.
    assert any(_weight_maps(pid) & host_weights for pid in jobs), \
        "no job process of the runtime maps the host's weights"


def test_an_idle_runtime_stops_and_starts_again_on_the_next_job(root, server_hf_home, test_snapshot):
    version = runtime_versions()[0]
    server = ServerProcess(
        [TEST_REPO], data_dir=root / "runtime-idle", hf_home=server_hf_home, api_key=API_KEY,
        env={"NNHOST_RUNTIME_IDLE_SECONDS": "3"},
    )
    server.start()
    try:
        assert job_nnsight(server, version, test_snapshot)[0] == version
        deadline = time.monotonic() + 120
        while runtime_templates(server, version) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not runtime_templates(server, version), "the idle runtime's template is still running"
        assert job_nnsight(server, version, test_snapshot)[0] == version
    finally:
        server.stop()


def test_where_one_process_runs_every_job_another_version_is_told_why(root, server_hf_home, test_snapshot):
    """Trusted mode (and an accelerator without the mapped design) has no template to fork from."""
    version = runtime_versions()[0]
    server = ServerProcess(
        [TEST_REPO], data_dir=root / "runtime-trusted", hf_home=server_hf_home, api_key=API_KEY,
        env={"NNHOST_CONTAINMENT": "false"},
    )
    server.start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            script = Path(folder) / "trace_remotely.py"
            script.write_text(VERSION_PROGRAM)
            done = run_script(python_of(version), server, script, TEST_REPO, str(test_snapshot))
        assert done.returncode != 0 and "JOB-NNSIGHT" not in done.stdout
        text = " ".join((done.stdout + done.stderr).split())
        assert f"nnsight {version} clients cannot be served by it" in text, text[-3000:]
        # The server's own version is served there as ever.
        assert job_nnsight(server, own_version(), test_snapshot)[0] == own_version()
    finally:
        server.stop()

"""Each OS-level layer, tested as if the Python sandbox had already been beaten.

A child process is contained exactly as a worker is, and then uses plain,
unrestricted Python (``os``, ``socket``, ``open``) to go after what the layers
protect: the server's data directory, the machine's accounts, the network, the
server's environment, other processes, and the machine's memory and process
table. Every attempt must fail. Skipped where the machine cannot contain at all
(not root, no namespaces): the server says so at start-up in that case.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "nnhost-layer-secret-4f1c"

CHILD = textwrap.dedent(
    """
    import json, os, socket, sys, time
    from nnhost.execution.os_layer import containment
    from nnhost.execution.os_layer.containment_policy import ContainmentPolicy

    problem = containment.enter_private_namespaces()
    import torch  # a loaded worker has torch's threads and libraries in place
    data_dir, port = sys.argv[1], int(sys.argv[2])
    policy = ContainmentPolicy(
        hide=[data_dir], memory_bytes=512 * 2**20, max_file_bytes=2**20,
        open_files=64, extra_tasks=8, scratch_bytes=64 * 2**20,
    )
    report = containment.contain(policy, problem)
    results = {"report": report.to_dict()}

    def attempt(name, action):
        try:
            results[name] = ["ok", repr(action())[:300]]
        except BaseException as error:
            results[name] = ["refused", f"{type(error).__name__}: {error}"[:300]]

    def status(field):
        with open("/proc/self/status") as file:
            return next(l.split(":", 1)[1].strip() for l in file if l.startswith(field + ":"))

    attempt("identity", lambda: (os.getuid(), os.getgid(), os.getgroups(), status("CapEff"), status("NoNewPrivs")))
    attempt("read database", lambda: open(data_dir + "/nnhost.sqlite3", "rb").read())
    attempt("read other result", lambda: open(data_dir + "/results/other.result", "rb").read())
    attempt("list data dir", lambda: os.listdir(data_dir))
    attempt("passwd", lambda: open("/etc/passwd").read())
    attempt("shadow", lambda: open("/etc/shadow").read())
    attempt("write repo", lambda: open(os.path.join(data_dir, "..", "planted"), "w"))
    attempt("write usr", lambda: open("/usr/planted", "w"))
    attempt("write scratch", lambda: open("/tmp/scratch-file", "w").write("fine"))
    attempt("big file", lambda: open("/tmp/big", "wb").write(b"x" * (4 * 2**20)))
    attempt("connect", lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
    attempt("interfaces", lambda: open("/proc/net/dev").read().count(":"))
    attempt("environ", lambda: os.environ.get("NNHOST_LAYER_SECRET"))
    attempt("environ block", lambda: b"nnhost-layer-secret" in open("/proc/self/environ", "rb").read())
    attempt("parent environ", lambda: open(f"/proc/{os.getppid()}/environ", "rb").read())
    attempt("parent cmdline", lambda: open(f"/proc/{os.getppid()}/cmdline", "rb").read())
    attempt("processes", lambda: sorted(p for p in os.listdir("/proc") if p.isdigit()))

    def fork_bomb():
        children = []
        try:
            for _ in range(200):
                pid = os.fork()
                if pid == 0:
                    time.sleep(30)
                    os._exit(0)
                children.append(pid)
        finally:
            for pid in children:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            results["forks"] = len(children)
    attempt("fork bomb", fork_bomb)
    attempt("memory bomb", lambda: bytearray(2**30))
    attempt("descriptors", lambda: [open("/dev/null") for _ in range(200)])
    attempt("regain root", lambda: os.setuid(0))
    print("RESULTS" + json.dumps(results))
    """
)


def _can_contain() -> bool:
    return sys.platform.startswith("linux") and os.geteuid() == 0


pytestmark = pytest.mark.skipif(not _can_contain(), reason="containment needs Linux and root")


@pytest.fixture(scope="module")
def contained():
    """Run the child once; every test reads its verdicts."""
    data_dir = Path(tempfile.mkdtemp(prefix=".layer-test-", dir=ROOT))
    (data_dir / "results").mkdir()
    (data_dir / "nnhost.sqlite3").write_bytes(b"SQLite format 3\x00 secret rows")
    (data_dir / "results" / "other.result").write_bytes(b"another user's activations")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    accepted = []
    done = threading.Event()

    def accept():
        while not done.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        completed = subprocess.run(
            [sys.executable, "-c", CHILD, str(data_dir), str(listener.getsockname()[1])],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "NNHOST_LAYER_SECRET": SECRET},
        )
    finally:
        done.set()
        thread.join(timeout=2)
        listener.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    line = next((l for l in completed.stdout.splitlines() if l.startswith("RESULTS")), None)
    assert line, completed.stdout[-2000:] + completed.stderr[-2000:]
    results = json.loads(line[len("RESULTS"):])
    results["accepted"] = len(accepted)
    return results


def refused(results, name, *reasons):
    verdict, detail = results[name]
    assert verdict == "refused", f"{name}: {detail}"
    if reasons:
        assert any(reason in detail for reason in reasons), f"{name}: {detail}"


def test_every_layer_is_active_here(contained):
    report = contained["report"]
    assert report["enabled"] and not report["unavailable"], report
    assert set(report["active"]) == {"filesystem", "network", "identity", "environment", "limits", "memory"}


def test_identity_is_unprivileged(contained):
    verdict, detail = contained["identity"]
    uid, gid, groups, caps, no_new_privs = eval(detail)  # the child's own repr
    assert uid >= 200_000 and gid >= 200_000 and groups == []
    assert int(caps, 16) == 0 and no_new_privs == "1"
    refused(contained, "regain root", "PermissionError")


def test_server_data_is_out_of_sight(contained):
    for name in ("read database", "read other result"):
        refused(contained, name, "No such file", "Permission denied")
    # An empty mount in its place, or (for a data dir under /tmp, which the
    # worker's private /tmp replaces) no such folder at all.
    listing = contained["list data dir"]
    assert listing == ["ok", "[]"] or (
        listing[0] == "refused" and "No such file" in listing[1]
    ), listing


def test_machine_accounts_are_not_readable(contained):
    verdict, passwd = contained["passwd"]
    assert verdict == "ok" and "nnhost worker" in passwd
    with open("/etc/passwd") as file:
        real_users = [line.split(":")[0] for line in file if line.strip()]
    hidden = [user for user in real_users if user not in ("root",)]
    assert hidden and not any(f"'{user}:" in passwd or f"\\n{user}:" in passwd for user in hidden)
    verdict, shadow = contained["shadow"]
    assert verdict == "refused" or shadow == "''"


def test_filesystem_is_read_only_but_scratch(contained):
    refused(contained, "write repo", "Read-only file system", "No such file")
    refused(contained, "write usr", "Read-only file system")
    assert contained["write scratch"][0] == "ok"
    refused(contained, "big file", "File too large")


def test_no_network(contained):
    refused(contained, "connect", "Network is unreachable")
    assert contained["accepted"] == 0
    assert contained["interfaces"] == ["ok", "1"]  # only lo


def test_environment_holds_no_secret(contained):
    assert contained["environ"] == ["ok", "None"]
    verdict, detail = contained["environ block"]
    assert verdict == "refused" or detail == "False"
    for name in ("parent environ", "parent cmdline"):
        refused(contained, name, "No such file", "Permission denied")
    verdict, detail = contained["processes"]
    assert verdict == "ok" and len(eval(detail)) == 1  # only itself


def test_process_memory_and_descriptor_limits(contained):
    assert contained["forks"] <= 8 + 2  # extra_tasks, give or take a thread that ended
    refused(contained, "memory bomb", "MemoryError")
    refused(contained, "descriptors", "Too many open files")


CRASH = textwrap.dedent(
    """
    import sys, torch
    from nnhost.execution.guard.integrity import WeightImage
    weight = torch.nn.Parameter(torch.randn(64, 64), requires_grad=False)
    image = WeightImage.build([weight])
    assert image is not None and float(weight.sum()) == float(weight.sum())
    print("READ-OK", flush=True)
    how = sys.argv[1]
    if how == "setitem":
        weight[:] = 0
    elif how == "data":
        weight.data.zero_()
    elif how == "numpy":
        weight.numpy()[:] = 0
    print("WROTE", flush=True)
    """
)


@pytest.mark.parametrize("how", ["setitem", "data", "numpy"])
def test_weights_in_the_image_cannot_be_written(how):
    """Whatever path a write takes, the kernel refuses it (the process faults)."""
    completed = subprocess.run(
        [sys.executable, "-c", CRASH, how], capture_output=True, text=True, timeout=120
    )
    assert "READ-OK" in completed.stdout and "WROTE" not in completed.stdout
    assert completed.returncode in (-signal.SIGSEGV, -signal.SIGBUS), completed.stderr[-500:]

"""What a job's process can no longer reach, tried by a user who has beaten the Python layer.

Each case runs raw Python in a job's process (`beaten_python`) and reports
what it got; each hole here was open before its layer (`job_layers`,
`syscall_filter`) closed it. After each, the next user's request must still
give the local result (``next_user_is_served``).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from .beaten_python import hostile, reported
from .helpers import PROMPT

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.geteuid() == 0),
    reason="fork-per-job containment needs Linux and root",
)

CALL = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)

        def call(result):
            return [result, os.strerror(ctypes.get_errno()) if result == -1 else ""]
"""


def test_no_page_the_host_made_is_shared_writable(next_user_is_served, mallory, remote_model):
    """A library's lock in /dev/shm, made before the fork, is each job's private copy."""
    found = reported(hostile(next_user_is_served, mallory, """
        import os
        maps = open("/proc/self/maps").read().splitlines()
        shared = [line for line in maps if line.split()[1][3] == "s"]
        fds = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds[fd] = os.readlink("/proc/self/fd/" + fd)
            except OSError:
                pass
        report({"shared": shared, "fds": fds})
    """, remote_model))
    writable = [line for line in found["shared"] if line.split()[1][1] == "w"]
    assert writable == [], writable
    # Shared and read-only: the weights, and the C library's locale cache.
    assert any("nnhost-weights" in line for line in found["shared"]), found["shared"]
    # Nothing of the host's but the job's own: log pipe, channel, payload, result.
    kinds = sorted(target.split(":")[0] if ":" in target else target.rsplit(".", 2)[-1]
                   for target in found["fds"].values() if target != f"/proc/{os.getpid()}/fd")
    assert all(kind in ("/dev/null", "pipe", "socket", "/memfd", "staged", "/proc/self/fd") or
               kind.startswith("/proc/") for kind in kinds), found["fds"]


def test_no_keyring_and_no_user_namespace(next_user_is_served, mallory, remote_model):
    """A key in the uid's keyring would outlive the job; a user namespace hands back capabilities."""
    found = reported(hostile(next_user_is_served, mallory, CALL + """
        KEY_SPEC_USER_KEYRING = ctypes.c_int(-4)
        add_key = {"x86_64": 248, "aarch64": 217}[os.uname().machine]
        report({
            "add_key": call(libc.syscall(add_key, b"user", b"left-by-mallory", b"secret", 6, KEY_SPEC_USER_KEYRING)),
            "user namespace": call(libc.unshare(0x10000000)),
            "mount namespace": call(libc.unshare(0x00020000)),
        })
    """, remote_model))
    assert found == {
        "add_key": [-1, "Operation not permitted"],
        "user namespace": [-1, "Operation not permitted"],
        "mount namespace": [-1, "Operation not permitted"],
    }


def test_no_program_can_be_started(next_user_is_served, mallory, remote_model):
    found = reported(hostile(next_user_is_served, mallory, """
        import os, subprocess
        try:
            subprocess.run([os.path.realpath("/bin/sh"), "-c", "echo started"], capture_output=True)
            report("started")
        except OSError as error:
            report(error.strerror)
    """, remote_model))
    assert found == "Operation not permitted"


def test_no_control_group_figures(next_user_is_served, mallory, remote_model):
    """The server's group counts earlier jobs' memory: its peak says what the last user did."""
    found = reported(hostile(next_user_is_served, mallory, """
        import os
        report(sorted(os.listdir("/sys/fs/cgroup")) if os.path.isdir("/sys/fs/cgroup") else [])
    """, remote_model))
    assert found == []


def test_a_failed_jobs_result_file_does_not_stay(next_user_is_served, mallory, remote_model):
    """What a job wrote into its result before failing is removed, not left for the daily sweep."""
    final = hostile(next_user_is_served, mallory, """
        _os.write(spec.result_fd, b"r" * (8 << 20))
        report("written")
    """, remote_model)
    assert reported(final) == "written"
    results = next_user_is_served.data_dir / "results"
    assert not [path for path in results.iterdir() if final["id"] in path.name]


def sample(model, remote, seed=None):
    with model.trace(PROMPT, remote=remote):
        if seed is not None:
            torch.manual_seed(seed)
        noise = torch.rand(8).save()
        picked = torch.multinomial(torch.softmax(model.lm_head.output[0, -1], -1), 4).save()
    return noise, picked


def test_each_job_draws_fresh_random_numbers(iso_server, remote_model, local_model):
    """Two jobs never start from the same random state; a seeded one is the local run."""
    first, second = sample(remote_model, iso_server.url), sample(remote_model, iso_server.url)
    assert not torch.equal(first[0], second[0])
    seeded = sample(remote_model, iso_server.url, seed=1234)
    local = sample(local_model, False, seed=1234)
    assert torch.equal(seeded[0], local[0]) and torch.equal(seeded[1], local[1])

"""A job's process settles (binds its weights) before its limits and identity, after its namespaces.

On a GPU the settling makes a device context: it reserves far more address
space and starts more threads than a job is allowed, so limits set before it
would make it fail. An H200 showed the mapped design's first job never
finishing with the limits first. The limits are then set on top of what the
process holds once settled.
"""

from __future__ import annotations

import json
import os
import resource
import sys

import pytest

from nnhost.execution.os_layer.containment_policy import ContainmentPolicy
from nnhost.execution.os_layer.job_layers import contain_job

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.geteuid() == 0),
    reason="a job's layers need Linux and root",
)

LIMITS = {"nproc": resource.RLIMIT_NPROC, "data": resource.RLIMIT_DATA, "as": resource.RLIMIT_AS}
UID = 250_123


def _seen() -> dict[str, object]:
    found: dict[str, object] = {name: list(resource.getrlimit(which)) for name, which in LIMITS.items()}
    found["uid"] = os.getuid()
    found["namespaces"] = {kind: os.readlink(f"/proc/self/ns/{kind}") for kind in ("mnt", "net", "ipc")}
    return found


def _in_a_child() -> dict[str, object]:
    """contain_job in a forked child, which reports what its settle step saw."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read)
            before = _seen()
            at_settle: dict[str, object] = {}
            report = contain_job(ContainmentPolicy(), UID, memory_cgroup=False,
                                 settle=lambda: at_settle.update(_seen()))
            after = _seen()
            os.write(write, json.dumps({"before": before, "settle": at_settle, "after": after,
                                        "active": report.active}).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as file:
        data = file.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    return json.loads(data)


def test_the_weights_are_bound_before_the_limits_and_identity():
    found = _in_a_child()
    before, settle, after = found["before"], found["settle"], found["after"]
    # Settling happens in the job's own namespaces...
    for kind in ("mnt", "net", "ipc"):
        assert settle["namespaces"][kind] != before["namespaces"][kind], kind
    # ...still root and with the limits the process was forked with.
    assert settle["uid"] == 0
    for name in LIMITS:
        assert settle[name] == before[name], (name, settle[name], before[name])
    # Then the limits and the identity hold.
    assert "limits" in found["active"] and "identity" in found["active"], found["active"]
    assert after["uid"] == UID
    for name in LIMITS:
        soft, _ = after[name]
        assert soft != resource.RLIM_INFINITY and (before[name][0] == resource.RLIM_INFINITY
                                                    or soft <= before[name][0]), (name, after[name])

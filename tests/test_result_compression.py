"""A result is compressed even where the job may start no thread.

zstd's multi-threaded mode reports a worker thread it could not start as
"Allocation error: not enough memory", and a job's process is held to a few
tasks (``RLIMIT_NPROC``). Here a process of an unprivileged uid, allowed one
task, compresses a result large enough for threads: it must succeed, and the
blob must be what a plain compression of the same bytes decompresses to.
"""

from __future__ import annotations

import io
import os
import resource

import pytest
import torch
import zstandard

from nnhost.execution.job.result_writing import serialize_result

NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="RLIMIT_NPROC does not bind root; the test drops to nobody")
def test_a_large_result_compresses_in_a_process_held_to_one_task() -> None:
    torch.set_num_threads(1)  # no pool of torch's may start in the child either
    value = {"x": torch.arange(1 << 22, dtype=torch.float32)}  # 16 MiB: large enough for threads
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through the pipe)
        os.close(read)
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
            blob = serialize_result(value, True)
            with os.fdopen(write, "wb") as out:
                out.write(blob)
            os._exit(0)
        except BaseException as error:  # noqa: BLE001 (anything: said through the pipe)
            os.write(write, b"ERROR " + repr(error).encode())
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as source:
        blob = source.read()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, blob[:300]
    loaded = torch.load(io.BytesIO(zstandard.ZstdDecompressor().decompress(blob)), weights_only=False)
    assert torch.equal(loaded["x"], value["x"])

"""A payload's frames are read straight from memory, and read the same as through pickle's buffer.

Protocol 4 puts a FRAME opcode (a length) before each run of about 64 KB of
opcodes, so that a reader of a stream can fetch the run at once. The payload
is in memory already, and going through pickle's per-frame buffer cost a
Python call on every read: about two thirds of a small payload's load in the
restricted (pure Python) unpickler. `RestrictedUnpickler.load_frame` reads the
payload itself from the first frame on. What is read must not change.
"""

from __future__ import annotations

import io
import pickle
import pickletools

import pytest

from nnhost.execution.python_layer.sandbox import SandboxPolicy
from nnhost.execution.unpickling.unpickler import restricted_unpickler


def _read(data: bytes):
    """What the restricted unpickler builds, before its check of a trace's shape."""

    class Reader(restricted_unpickler(SandboxPolicy())):  # type: ignore[misc]
        def _check_payload(self, result):
            return result

    return Reader(io.BytesIO(data)).load()


def test_a_payload_of_many_frames_reads_as_pickle_reads_it() -> None:
    value = {f"key {i}": [i, f"{i}" * 40, float(i), (i, None, True), b"x" * (i % 300)] for i in range(4000)}
    data = pickle.dumps(value, protocol=4)
    frames = sum(1 for opcode, _, _ in pickletools.genops(data) if opcode.name == "FRAME")
    assert frames > 3  # the case this is about
    assert _read(data) == value == pickle.loads(data)


def test_a_payload_that_ends_inside_a_frame_length_is_an_error() -> None:
    with pytest.raises(pickle.UnpicklingError, match="frame"):
        _read(pickle.PROTO + b"\x04" + pickle.FRAME + b"\x01\x02")  # 2 of a length's 8 bytes
    data = pickle.dumps([f"{i}" * 50 for i in range(3000)], protocol=4)
    with pytest.raises((pickle.UnpicklingError, EOFError)):
        _read(data[: len(data) // 2])

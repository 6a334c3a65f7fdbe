"""Hand-built pickle payloads posted over raw HTTP: each ends ERROR naming what was refused.

These never go through the nnsight client: they are what an attacker writes
with ``pickle`` directly, aiming at the unpickler rather than the sandbox. The
job must fail while being read, with the refused global (or write) named, and
the server must then serve a normal request correctly.
"""

from __future__ import annotations

import builtins
import copyreg
import os
import pickle
import re
import subprocess

import pytest
import torch

from .helpers import run_blob


def reduce_to(function, *args) -> bytes:
    """A pickle whose loading calls ``function(*args)`` (the classic REDUCE gadget)."""

    class Gadget:
        def __reduce__(self):
            return (function, args)

    return pickle.dumps(Gadget(), protocol=4)


def opcodes(*parts: bytes) -> bytes:
    return b"\x80\x04" + b"".join(parts) + b"."


def text(value: str) -> bytes:
    encoded = value.encode()
    return b"\x8c" + bytes([len(encoded)]) + encoded  # SHORT_BINUNICODE


def stack_global(module: str, name: str) -> bytes:
    return text(module) + text(name) + b"\x93"  # STACK_GLOBAL


def nested_torch_save_gadget() -> bytes:
    """A tensor storage whose bytes are themselves a malicious pickle.

    torch reads such bytes with its full unpickler; the server must not.
    """
    return pickle.dumps(_StorageFromBytes(reduce_to(os.system, "id")), protocol=4)


class _StorageFromBytes:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self):
        from torch.storage import _load_from_bytes

        return (_load_from_bytes, (self.data,))


GADGETS = [
    pytest.param(lambda: reduce_to(os.system, "id"), r"posix\.system", id="os-system"),
    pytest.param(lambda: reduce_to(builtins.eval, "__import__('os')"), r"builtins\.eval", id="eval"),
    pytest.param(lambda: reduce_to(builtins.exec, "import os"), r"builtins\.exec", id="exec"),
    pytest.param(lambda: reduce_to(builtins.__import__, "os"), r"builtins\.__import__", id="import"),
    pytest.param(lambda: reduce_to(builtins.open, "/etc/passwd"), r"(builtins|io)\.open", id="open"),
    pytest.param(
        lambda: reduce_to(subprocess.Popen, ["id"]), r"subprocess\.Popen", id="subprocess-popen"
    ),
    pytest.param(
        lambda: reduce_to(copyreg._reconstructor, object, object, None),
        r"copyreg\._reconstructor",
        id="copyreg-reconstructor",
    ),
    pytest.param(
        lambda: reduce_to(getattr, torch.nn.functional.relu, "__globals__"),
        r"the attribute '__globals__'",
        id="getattr-globals",
    ),
    pytest.param(
        lambda: opcodes(stack_global("torch.serialization", "load"), text("/x"), b"\x85", b"R"),
        r"torch\.serialization\.load",
        id="torch-load",
    ),
    pytest.param(
        lambda: opcodes(
            stack_global("nnsight.intervention.serialization", "loads"), b"C\x01x", b"\x85", b"R"
        ),
        r"nnsight\.intervention\.serialization\.loads",
        id="nnsight-loads",
    ),
    pytest.param(
        lambda: opcodes(stack_global("cloudpickle.cloudpickle", "_make_function"), b")", b"R"),
        r"cloudpickle\.cloudpickle\._make_function",
        id="bytecode-function",
    ),
    pytest.param(
        lambda: opcodes(stack_global("torch", "Tensor.__init__.__globals__")),
        r"torch\.Tensor\.__init__\.__globals__",
        id="dotted-dunder-walk",
    ),
    pytest.param(
        nested_torch_save_gadget,
        r"Weights only load failed|could not read your request",
        id="nested-torch-storage",
    ),
    pytest.param(
        lambda: b"(ios\nsystem\nS'id'\no.",
        r"old pickle opcode|posix\.system|os\.system",
        id="protocol-0-inst",
    ),
    pytest.param(
        lambda: opcodes(text("Module:model.transformer"), b"Q", b"}", text("training"), b"\x88s", b"b"),
        r"a change to .*GPT2Model",
        id="build-into-the-live-model",
    ),
    pytest.param(
        lambda: opcodes(
            stack_global("torch.nn", "functional"), b"}", text("gelu"), b"N", b"s", b"b"
        ),
        r"a change to torch\.nn\.functional|a change to",
        id="build-into-a-library-module",
    ),
    pytest.param(
        lambda: opcodes(text("Module:model.transformer.h"), b"Q", text("_modules"), b"\x86", b"."),
        r"not an nnsight trace",
        id="persistent-object-not-a-trace",
    ),
    pytest.param(
        # An nnsight edit compiles its source when unpickled: same rules as the block.
        lambda: opcodes(
            stack_global("nnsight.intervention.interleaver", "Mediator"), b")", b"\x81",
            b"}", text("reduced"), text("import os\nos.system('id')"), b"}", b"}", b"\x87", b"s",
            text("copy"), b"\x89", b"s", text("presaved"), b"\x8f", b"s", b"b",
        ),
        r"importing 'os' is not allowed",
        id="edit-with-hostile-source",
    ),
    pytest.param(
        # A sympy object whose constructor would parse (eval) its string arguments.
        lambda: opcodes(
            stack_global("sympy", "Matrix"), text("__import__('os').system('id')"),
            b"\x85", b"\x85", b"\x81",
        ),
        r"an instance of sympy\.",
        id="library-constructor",
    ),
    # Images travel as data (`unpickling.images`): none of Pillow's callables may be named.
    pytest.param(
        lambda: opcodes(stack_global("PIL.Image", "open"), text("/etc/passwd"), b"\x85", b"R"),
        r"PIL\.Image\.open",
        id="pil-image-open",
    ),
    pytest.param(
        lambda: opcodes(stack_global("PIL.ImageMath", "unsafe_eval"), text("1"), b"\x85", b"R"),
        r"PIL\.ImageMath\.unsafe_eval",
        id="pil-imagemath-eval",
    ),
    pytest.param(
        lambda: opcodes(stack_global("PIL.Image", "Image.frombytes")),
        r"PIL\.Image\.Image\.frombytes",
        id="pil-image-method",
    ),
    pytest.param(
        # 60000 x 60000 RGB pixels asked for, three bytes sent: no allocation happens.
        lambda: opcodes(
            stack_global("PIL.Image", "Image"), b")", b"\x81", b"]", b"(", b"}", text("RGB"),
            b"M\x60\xea", b"M\x60\xea", b"\x86", b"N", b"C\x03abc", b"e", b"b",
        ),
        r"60000x60000 has 10800000000 bytes of pixels, not 3",
        id="pil-image-size-bomb",
    ),
    pytest.param(
        # A table as state would set any attribute of the image.
        lambda: opcodes(
            stack_global("PIL.PngImagePlugin", "PngImageFile"), b")", b"\x81",
            b"}", text("fp"), text("/etc/passwd"), b"s", b"b",
        ),
        r"a malformed image",
        id="pil-image-attributes",
    ),
    pytest.param(
        # A second BUILD on a filled image would replace its pixels behind the first's back.
        lambda: opcodes(
            stack_global("PIL.Image", "Image"), b")", b"\x81", b"\x94",
            b"]", b"(", b"}", text("L"), b"K\x01", b"K\x01", b"\x86", b"N", b"C\x01x", b"e", b"b",
            b"h\x00", b"]", b"(", b"}", text("L"), b"K\x01", b"K\x01", b"\x86", b"N", b"C\x01y", b"e", b"b",
        ),
        r"an image filled in twice",
        id="pil-image-built-twice",
    ),
    pytest.param(lambda: pickle.dumps({"x": 1}, protocol=4), r"not an nnsight trace", id="not-a-trace"),
    pytest.param(
        lambda: opcodes(text("Module:does.not.exist"), b"Q"),
        r"which this server's model does not have",
        id="unknown-persistent-id",
    ),
]


@pytest.mark.parametrize("make_blob, refused", GADGETS)
def test_gadget_is_refused_while_reading(make_blob, refused, serving):
    final = run_blob(serving, make_blob())
    assert final["status"] == "ERROR", final
    assert re.search(refused, final["description"], re.S), final["description"]
    assert "Traceback" not in final["description"] or "nnhost/execution" not in final["description"]


def test_deeply_nested_payload_is_an_error_not_a_crash(serving):
    blob = b"\x80\x04" + b"]" * 200_000 + b"."  # EMPTY_LIST x 200k: a huge stack, no recursion
    final = run_blob(serving, blob)
    assert final["status"] == "ERROR"
    nested = b"\x80\x04" + b"(" * 100_000 + b"l" * 100_000 + b"."
    final = run_blob(serving, nested)
    assert final["status"] == "ERROR"

"""The result blob of a job: its saved values, serialized and written where the server said.

`serialize_result` is ``torch.save`` of the saved values, tensors cut off the
server's autograd graph, zstd-compressed when the request asked; `write_all`
writes it to the descriptor the server handed over, `write_atomically` to a
path (in-process runs). It must never rebuild or change a saved value, and
never write anywhere but the file it was given.
"""

from __future__ import annotations

import enum
import io
import os
import pickle
import types
import typing
from typing import Any

from ..unpickling.shipped_classes import client_class_id
from .made_classes import by_reference, forward_ref_reduce, remade_class_reduce

_PROTOCOL = 4


class _ResultPickler(pickle.Pickler):
    """Pickles saved values as they are, as the client's own types.

    The client loads the blob with a full unpickler (``torch.load`` with
    ``weights_only=False`` in nnsight's ``RemoteBackend``), so a model output
    class, a ``torch.Size`` or a named tuple goes out as that type. What the
    server has to do on top of plain pickling:

    * A saved activation may still hang off this run's graph (a user opted
      into gradients); pickling it as is would drag the graph along, or fail:
      it goes out cut off, still requiring grad. A leaf's ``.grad`` goes with
      it, as a local run keeps it on the tensor.
    * A class the client shipped goes back as the id the client's cloudpickle
      gave it, so its instances arrive as instances of the user's own class
      (cloudpickle resolves the id in the client's process).
    * A class made during the run (a named tuple, a dataclass, an enum, a
      class statement in a helper) goes back as the standard-library call
      that makes an equivalent one on the client (`made_classes`). No code
      goes by value: a function made during the run is refused, as the
      server sends no code of its own making to a client.
    """

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if isinstance(obj, torch.Tensor):
            return _tensor_reduce(obj)
        if isinstance(obj, type):
            client_id = client_class_id(obj)
            if client_id is not None:
                return _client_class_reduce(obj, client_id)
            if not by_reference(obj):
                return remade_class_reduce(obj) or NotImplemented
        elif isinstance(obj, enum.Enum) and not by_reference(type(obj)):
            # A functional-API enum whose module Python could not tell is made
            # unpicklable by its own ``__reduce_ex__``; the member is its value.
            return (type(obj), (obj._value_,))
        elif isinstance(obj, typing.ForwardRef):
            # An annotation's text (a ``typing.NamedTuple`` field under ``from
            # __future__ import annotations``) holds its compiled code: the text goes.
            return forward_ref_reduce(obj)
        return NotImplemented


def _tensor_reduce(tensor: Any) -> Any:
    import torch
    from torch._tensor import _rebuild_from_type_v2

    if tensor.requires_grad and not tensor.is_leaf:
        return tensor.detach().requires_grad_(True).__reduce_ex__(_PROTOCOL)
    if type(tensor) is not torch.Tensor or tensor.grad is None:
        return NotImplemented  # a subclass keeps its own reduction
    rebuild, args = tensor.__reduce_ex__(_PROTOCOL)[:2]  # type: ignore[no-untyped-call]
    # torch's own rebuild with state: setattr(tensor, "grad", ...) on the client.
    return (_rebuild_from_type_v2, (rebuild, torch.Tensor, args, {"grad": tensor.grad.detach()}))


def _client_class_reduce(cls: type, client_id: str) -> Any:
    import enum

    from cloudpickle import cloudpickle as cp  # type: ignore[import-untyped]

    if isinstance(cls, enum.EnumMeta):
        arguments = list(cp._enum_getnewargs(cls))
        arguments[5] = client_id
        return (cp._make_skeleton_enum, tuple(arguments))
    arguments = list(cp._class_getnewargs(cls))
    arguments[4] = client_id
    return (cp._make_skeleton_class, tuple(arguments))


#: What `torch.save` takes as its ``pickle_module``: only its Pickler is used.
_PICKLE_MODULE = types.SimpleNamespace(Pickler=_ResultPickler, __name__="nnhost_pickle")


def serialize_result(saves: dict[str, Any], compress: bool) -> bytes:
    """The result blob: ``torch.save`` of the saved values, zstd when asked."""
    import torch

    buffer = io.BytesIO()
    torch.save(dict(saves), buffer, pickle_module=_PICKLE_MODULE, pickle_protocol=_PROTOCOL)
    data = buffer.getvalue()
    if compress:
        data = compress_result(data)
    return data


#: Below this, one thread compresses faster than starting more.
_THREADED_FROM = 8 * 1024 * 1024


def compress_result(data: bytes) -> bytes:
    """zstd at level 1: a few threads for a large blob, one where threads cannot be had.

    A job's process may start only a few tasks (``RLIMIT_NPROC``, its
    cgroup's ``pids.max``), and the in-process host's budget is shared with
    torch's and the driver's threads; zstd reports a thread it could not start
    as "Allocation error: not enough memory". ``threads=-1`` (one per core)
    is the likely cause of that very error for a two-prompt result on a
    16-core GPU host; a job held to one task reproduces it on the CPU. Where
    threads cannot be had, compression goes on in this thread.
    """
    import zstandard

    threads = min(4, os.cpu_count() or 1) if len(data) >= _THREADED_FROM else 0
    if threads > 1:
        try:
            return zstandard.ZstdCompressor(level=1, threads=threads).compress(data)
        except zstandard.ZstdError:
            pass
    return zstandard.ZstdCompressor(level=1).compress(data)


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to a descriptor the server handed over (the job's result file).

    Not flushed to the disk (no fsync), like a payload (`storage.blobs`): the
    result is as durable as the COMPLETED row that names it, which SQLite
    commits with ``synchronous=NORMAL``, and a small result reaches the
    client inline in its COMPLETED frame anyway. A crash of nnhost or of this
    process loses nothing written here; a power cut may lose the last moments
    of both. The fsync was about 1 ms of every request's path, between the
    run and the COMPLETED frame.
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_atomically(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "wb") as file:
        file.write(data)
    os.replace(partial, path)

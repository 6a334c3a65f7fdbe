"""The result blob of a job: its saved values, serialized and written where the server said.

`serialize_result` is ``torch.save`` of the saved values, tensors cut off the
server's autograd graph, zstd-compressed when the request asked; `write_all`
writes it to the descriptor the server handed over, `write_atomically` to a
path (in-process runs). It must never rebuild or change a saved value, and
never write anywhere but the file it was given.
"""

from __future__ import annotations

import io
import os
import pickle
import types
from typing import Any


_PROTOCOL = 4


class _DetachingPickler(pickle.Pickler):
    """Pickles saved values as they are, with tensors cut off the server's autograd graph.

    A saved activation may still hang off this run's graph (a user opted into
    gradients); pickling it as is would drag the graph along, or fail. The
    values themselves are never rebuilt: a model output class, a
    ``torch.Size``, a named tuple or a dataclass goes out as that type, since
    the client loads the blob with a full unpickler (``torch.load`` with
    ``weights_only=False`` in nnsight's ``RemoteBackend``).
    """

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if isinstance(obj, torch.Tensor) and obj.requires_grad and not obj.is_leaf:
            return obj.detach().requires_grad_(True).__reduce_ex__(_PROTOCOL)
        return NotImplemented


#: What `torch.save` takes as its ``pickle_module``: only its Pickler is used.
_PICKLE_MODULE = types.SimpleNamespace(Pickler=_DetachingPickler, __name__="nnhost_pickle")


def serialize_result(saves: dict, compress: bool) -> bytes:
    """The result blob: ``torch.save`` of the saved values, zstd when asked."""
    import torch

    buffer = io.BytesIO()
    torch.save(dict(saves), buffer, pickle_module=_PICKLE_MODULE, pickle_protocol=_PROTOCOL)
    data = buffer.getvalue()
    if compress:
        import zstandard

        data = zstandard.ZstdCompressor(level=1, threads=-1).compress(data)
    return data


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to a descriptor the server handed over (the job's result file)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.fsync(fd)


def write_atomically(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "wb") as file:
        file.write(data)
    os.replace(partial, path)

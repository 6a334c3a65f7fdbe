"""The mapped design's weights: exported by the host, bound into each job's own module tree.

In the mapped design (see `template`) the process that holds the weights
(the host) never forks a job's process, and the process that forks them
(the template) never holds the weights: it has the model's module tree
built on the meta device. Each job's process maps the host's weights by
handle and binds them into its copy of that tree before it says it is ready.

On the CPU the handles are three sealed memfds, passed as descriptors:

* the **parameters**, the same pages the host's own parameters use (a
  `weights.WeightImage`), mapped shared and read-only: a job's write into a
  weight faults, as in the fork design, and every job reads the same memory;
* the **buffers and tensor attributes** (a causal mask, rotary frequencies),
  which some forward passes legitimately write: mapped private, so a job's
  write makes its own copy and no other job sees it;
* the **layout**: JSON naming each tensor, which image holds it, where, and
  its dtype, shape and strides.

`export` runs in the host, `bind` in a job's process. Neither runs user code.
`bind` must never leave a meta tensor in the tree (it raises, naming it), and
never accept a tensor whose shape or dtype differs from the tree's: the
layout comes from our own host, but a mismatch means the two processes built
different models.
"""

from __future__ import annotations

import json
import mmap
import os
import warnings
from dataclasses import dataclass
from typing import Any, Optional

from .weights import WeightImage, pack_storages

PARAMETER, BUFFER, ATTRIBUTE = "parameter", "buffer", "attribute"


@dataclass
class ExportedWeights:
    """What the host hands the template: descriptors (parameters, the rest, layout) and sizes."""

    fds: list[int]
    tensors: int
    parameter_bytes: int
    other_bytes: int

    def close(self) -> None:
        for fd in self.fds:
            if fd >= 0:
                os.close(fd)
        self.fds = []


def _named_tensors(root: Any) -> list[tuple[str, str, Any]]:
    import torch

    named: list[tuple[str, str, Any]] = []
    named += [(name, PARAMETER, t) for name, t in root.named_parameters(remove_duplicate=False)]
    named += [(name, BUFFER, t) for name, t in root.named_buffers(remove_duplicate=False)]
    for prefix, module in root.named_modules(remove_duplicate=False):
        for key, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                named.append((f"{prefix}.{key}" if prefix else key, ATTRIBUTE, value))
    return named


def export(model: Any) -> ExportedWeights:
    """In the host: seal the weights into memfds (re-pointing its own parameters at them)."""
    root = model._module
    named = _named_tensors(root)
    parameters = [t for _, kind, t in named if kind == PARAMETER]
    image = WeightImage.build(parameters, keep_fd=True)
    if image is None:
        raise OSError("this system cannot seal the weights into a memfd, which the mapped design needs")
    others = [t for _, kind, t in named if kind != PARAMETER]
    packed = pack_storages(others)
    if packed is None:  # no buffers at all: an empty image, so that three handles always travel
        other_fd, other_size, other_offsets = _sealed(b""), 0, {}
    else:
        other_fd, other_size, _, _, other_offsets = packed
    entries = []
    for name, kind, tensor in named:
        entry: dict[str, Any] = {
            "name": name, "kind": kind, "dtype": str(tensor.dtype).removeprefix("torch."),
            "size": list(tensor.size()), "stride": list(tensor.stride()),
            "storage_offset": tensor.storage_offset(),
            "requires_grad": bool(tensor.requires_grad) if kind == PARAMETER else False,
        }
        if tensor.numel() == 0:
            entry["image"] = -1
        else:
            storage = tensor.untyped_storage()
            entry["nbytes"] = storage.nbytes()
            if kind == PARAMETER:
                entry["image"], entry["offset"] = 0, image.offset_of(tensor)
            else:
                entry["image"], entry["offset"] = 1, other_offsets[storage.data_ptr()]
        entries.append(entry)
    layout = json.dumps({"sizes": [image.size, other_size], "tensors": entries}).encode()
    layout_fd = _sealed(layout)
    return ExportedWeights([image.fd, other_fd, layout_fd], len(entries), image.size, other_size)


def _sealed(data: bytes) -> int:
    import fcntl

    fd = os.memfd_create("nnhost-weight-layout", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    return fd


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0)


def bind(model: Any, fds: list[int]) -> int:
    """In a job's process: map the host's weights and put them into this process's tree.

    Returns how many tensors were bound. The descriptors stay open (the
    caller closes them with everything else it does not keep).
    """
    import torch

    layout = json.loads(_read_all(fds[2]))
    sizes = layout["sizes"]
    maps: list[Optional[mmap.mmap]] = [
        mmap.mmap(fds[0], sizes[0], mmap.MAP_SHARED, mmap.PROT_READ),
        mmap.mmap(fds[1], sizes[1], mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        if sizes[1] else None,
    ]
    root = model._module
    storages: dict[tuple[int, int], Any] = {}
    made: dict[int, Any] = {}  # id of the meta tensor -> what replaces it (tied weights stay tied)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # "the buffer is not writable": the parameters are not
        for entry in layout["tensors"]:
            owner_name, _, leaf = entry["name"].rpartition(".")
            owner = root.get_submodule(owner_name) if owner_name else root
            old = getattr(owner, leaf)
            dtype = getattr(torch, entry["dtype"])
            if not isinstance(old, torch.Tensor) or tuple(old.shape) != tuple(entry["size"]) or old.dtype != dtype:
                raise RuntimeError(
                    f"the host's {entry['name']} ({entry['dtype']} {entry['size']}) does not fit this "
                    f"process's model ({getattr(old, 'dtype', None)} {list(getattr(old, 'shape', []))})"
                )
            new = made.get(id(old))
            if new is None:
                if entry["image"] < 0:
                    tensor = torch.empty_strided(entry["size"], entry["stride"], dtype=dtype)
                else:
                    key = (entry["image"], entry["offset"])
                    storage = storages.get(key)
                    if storage is None:
                        buffer = maps[entry["image"]]
                        if buffer is None:
                            raise RuntimeError(f"no image holds {entry['name']}")
                        view = torch.frombuffer(buffer, dtype=torch.uint8, count=entry["nbytes"],
                                                offset=entry["offset"])
                        storage = storages[key] = view.untyped_storage()
                    tensor = torch.empty(0, dtype=dtype).set_(
                        storage, entry["storage_offset"], entry["size"], entry["stride"]
                    )
                if entry["kind"] == PARAMETER:
                    tensor = torch.nn.Parameter(tensor, requires_grad=entry["requires_grad"])
                new = made[id(old)] = tensor
            setattr(owner, leaf, new)
    left = [name for name, _, tensor in _named_tensors(root) if tensor.device.type == "meta"]
    if left:
        raise RuntimeError(f"no weights arrived for {', '.join(left[:5])}: the mapped design cannot serve this model")
    return len(made)

"""The model's CPU weights in read-only memory, and a checksum for the rest.

A request may try to write into the shared model's weights by any path:
``weight[:] = 0``, ``.data.zero_()``, a numpy view of the parameter, native
code. Rather than check after every job (a pass over every weight), the
weights are moved once into memory the process cannot write: a ``memfd`` is
filled with them, sealed (no descriptor can change it any more) and mapped
read-only, and each parameter is re-pointed at its place in the mapping. A
write is then a fault the kernel refuses; the worker dies and is restarted.
Reading is unchanged (the same pages, no copy kept), and the memory is the
same as before: the original tensors are freed.

Weights on an accelerator cannot be mapped this way. For them, the check after
each job is `WeightSeal`: every parameter's version counter (torch bumps it on
each in-place write through the parameter or any view or ``detach()`` of it),
its data pointer and its storage, a few integer reads per tensor whatever its
size. Writes that bypass the counter (through ``.data``) are refused as they
happen by `fresh_memory.job_memory`. The exact `fingerprint` of every byte is
kept off the request path: taken when the weights are placed, compared when
the replica is idle (`ModelGuard.verify_weights`), and computed in fixed-size
chunks so that it needs a few tens of MiB of temporaries on the device, not
several bytes per weight.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Any, Iterable, Optional


class WeightImage:
    """The CPU parameters of a model, held in one sealed memfd mapped read-only."""

    ALIGN = 64

    def __init__(self, mapping: mmap.mmap, size: int, tensors: int) -> None:
        self.mapping = mapping
        self.size = size
        self.tensors = tensors
        #: The sealed memfd, when `build` was asked to keep it (else -1).
        self.fd = -1

    @classmethod
    def build(cls, tensors: Iterable[Any], keep_fd: bool = False) -> Optional["WeightImage"]:
        """Move ``tensors`` (CPU parameters) into the image; None when not possible here.

        ``keep_fd``: keep the sealed memfd open (`fd`) so that other processes
        can map the same pages (the mapped design, `weights.mapped`).
        """
        import torch

        packed = pack_storages(tensors, cls.ALIGN)
        if packed is None:
            return None
        fd, size, groups, storages, offsets = packed
        try:
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            if not keep_fd:
                # The mapping keeps the memfd alive; no descriptor is left to find.
                os.close(fd)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "the buffer is not writable": that is the point
            for key, members in groups.items():
                nbytes = storages[key].nbytes()
                view = torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=offsets[key])
                storage = view.untyped_storage()
                with torch.no_grad():
                    for tensor in members:
                        tensor.data = torch.empty(0, dtype=tensor.dtype).set_(
                            storage, tensor.storage_offset(), tensor.size(), tensor.stride()
                        )
        image = cls(mapping, size, sum(len(m) for m in groups.values()))
        image.fd = fd if keep_fd else -1
        return image

    def offset_of(self, tensor: Any) -> int:
        """Where ``tensor``'s storage starts in the image (a tensor `build` re-pointed)."""
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = torch.frombuffer(self.mapping, dtype=torch.uint8, count=1).data_ptr()
        offset: int = tensor.untyped_storage().data_ptr() - base
        return offset


def seal(fd: int) -> None:
    """Seal a memfd: not even a process holding the descriptor can change or resize it."""
    fcntl.fcntl(
        fd,
        fcntl.F_ADD_SEALS,
        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL,
    )


#: What `pack_storages` returns: ``(fd, size, tensors by storage, storages, offsets by storage)``.
PackedStorages = tuple[int, int, dict[int, list[Any]], dict[int, Any], dict[int, int]]


def pack_storages(tensors: Iterable[Any], align: int = 64) -> Optional[PackedStorages]:
    """Copy the storages of CPU ``tensors`` into one new memfd, sealed against any change.

    Returns ``(fd, size, tensors by storage, storages, offsets by storage)``
    (storages keyed by their data pointer; tensors sharing one stay together),
    or None when there is nothing to pack or the system has no sealed memfds.
    """
    import torch

    if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
        return None
    groups: dict[int, list[Any]] = {}
    storages: dict[int, Any] = {}
    for tensor in tensors:
        if tensor.device.type != "cpu" or tensor.is_sparse or tensor.numel() == 0:
            continue
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        storages[key] = storage
        groups.setdefault(key, []).append(tensor)
    if not storages:
        return None
    offsets, size = {}, 0
    for key, storage in storages.items():
        offsets[key] = size
        size += -(-storage.nbytes() // align) * align
    size = max(size, mmap.PAGESIZE)
    fd = os.memfd_create("nnhost-weights", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        writer = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            for key, storage in storages.items():
                target = torch.frombuffer(
                    writer, dtype=torch.uint8, count=storage.nbytes(), offset=offsets[key]
                )
                target.copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
                del target
        finally:
            writer.close()
        seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, size, groups, storages, offsets


class WeightSeal:
    """What a job cannot change about a tensor without torch noticing: O(1) per tensor.

    ``_version`` is the counter autograd keeps for in-place writes; it is shared
    by every view and ``detach()`` of the tensor, so ``weight[:] = 0``,
    ``weight.add_(1)`` and ``weight.detach().zero_()`` all bump it. The data
    and storage pointers catch a tensor re-pointed at other memory.
    """

    def __init__(self, named: Iterable[tuple[str, Any]]) -> None:
        self.entries = [(name, tensor, _identity(tensor)) for name, tensor in named]

    def changed(self) -> list[str]:
        """Names of the tensors written in place or re-pointed since the seal was taken."""
        return [name for name, tensor, identity in self.entries if _identity(tensor) != identity]


def _identity(tensor: Any) -> tuple[int, int, int]:
    return (tensor._version, tensor.data_ptr(), tensor.untyped_storage().data_ptr())


#: Elements fingerprinted at a time: 4M elements make 64 MiB of int64 temporaries at most.
CHUNK_ELEMENTS = 1 << 22

_POSITIONS: dict[str, Any] = {}


def _positions(device: Any, count: int) -> Any:
    """1, 2, 3, ... (mod 65521) as int64 on ``device``, built once per device and reused."""
    import torch

    key = str(device)
    cached = _POSITIONS.get(key)
    if cached is None or cached.numel() < count:
        cached = torch.arange(1, max(count, CHUNK_ELEMENTS) + 1, device=device, dtype=torch.int64) % 65521
        _POSITIONS[key] = cached
    return cached[:count]


def fingerprint(tensor: Any, chunk: int = CHUNK_ELEMENTS) -> int:
    """An exact fingerprint of a tensor's bytes, read in chunks of ``chunk`` elements.

    Each chunk's bit patterns are widened to int64 and summed twice: plainly,
    and weighted by position (so a swap of two values shows). Temporaries never exceed two
    int64 chunks, whatever the tensor's size.
    """
    import torch

    flat = tensor.detach().reshape(-1)
    size = flat.element_size()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(size)
    if as_int is None or flat.numel() == 0:
        return int(flat.numel())
    bits_all = flat.view(as_int)
    plain = weighted = 0
    for start in range(0, bits_all.numel(), chunk):
        bits = bits_all[start : start + chunk].to(torch.int64)
        positions = _positions(bits.device, bits.numel())
        # The position weight restarts each chunk; the chunk index is mixed in on the host.
        offset = start // chunk + 1
        plain += int(bits.sum())
        weighted += offset * int((bits * positions).sum())
        del bits
    return (weighted ^ plain) & ((1 << 64) - 1)


def checksum(tensor: Any) -> int:
    """`fingerprint` with the default chunk size (kept for callers of the old name)."""
    return fingerprint(tensor)

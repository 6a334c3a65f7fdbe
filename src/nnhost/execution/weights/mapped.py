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

import contextlib
import json
import mmap
import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional

from .cpu import WeightImage, pack_storages, seal

if TYPE_CHECKING:
    from .cuda_handles import DeviceImage

PARAMETER, BUFFER, ATTRIBUTE = "parameter", "buffer", "attribute"


@dataclass
class ExportedWeights:
    """What the host hands the template: one descriptor per image, then the layout's."""

    fds: list[int]
    tensors: int
    #: Bytes of each image, in the order of ``fds``.
    sizes: list[int]
    #: The host's device images (kept alive: they are the host's own weights).
    device_images: list[DeviceImage] = field(default_factory=list)

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


def _storage_bytes(tensor: Any) -> Any:
    """A tensor's whole storage as uint8 on the CPU (a copy when it lives on a device)."""
    import torch

    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
    return raw if tensor.device.type == "cpu" else raw.cpu()


def export(model: Any, image: Optional[WeightImage] = None) -> ExportedWeights:
    """In the host: seal the weights into images (re-pointing its own parameters at them).

    ``image``: the CPU parameters are already sealed there, with its descriptor
    kept (the fork design's host, `worker.secure`): exported as they are.

    Images, in order: the CPU parameters (a sealed memfd, shared read-only),
    the buffers and tensor attributes of every device (a sealed memfd, copied
    to the CPU; each job maps it privately and moves them to their device),
    then one device allocation per accelerator holding parameters
    (`cuda_handles`).
    """
    import torch

    root = model._module
    named = _named_tensors(root)
    parameters = [t for _, kind, t in named if kind == PARAMETER]
    on_cpu = [t for t in parameters if t.device.type == "cpu"]
    images: list[dict[str, Any]] = []
    fds: list[int] = []
    places: dict[int, tuple[int, int]] = {}  # storage pointer -> (image, offset)
    if image is not None and on_cpu:
        shared_fd = os.dup(image.fd)  # the image keeps its own; these are the receiver's
    else:
        image = WeightImage.build(on_cpu, keep_fd=True) if on_cpu else None
        shared_fd = image.fd if image is not None else -1
    if image is not None:
        for tensor in on_cpu:
            if tensor.numel():
                places[tensor.untyped_storage().data_ptr()] = (len(images), image.offset_of(tensor))
        images.append({"kind": "shared", "size": image.size, "device": "cpu"})
        fds.append(shared_fd)
    elif on_cpu and any(t.numel() for t in on_cpu):
        raise OSError("this system cannot seal the weights into a memfd, which the mapped design needs")
    # Buffers and attributes: one CPU copy per storage, whatever device it lives on.
    copies: dict[int, Any] = {}
    for _, kind, tensor in named:
        if kind != PARAMETER and tensor.numel() and tensor.untyped_storage().data_ptr() not in copies:
            copies[tensor.untyped_storage().data_ptr()] = _storage_bytes(tensor)
    packed = pack_storages(list(copies.values()))
    private = len(images)
    if packed is None:  # no buffers at all: an empty image, so that the handles always line up
        images.append({"kind": "private", "size": 0, "device": "cpu"})
        fds.append(_sealed(b""))
    else:
        fd, size, _, _, offsets = packed
        for key, copy in copies.items():
            places[key] = (private, offsets[copy.untyped_storage().data_ptr()])
        images.append({"kind": "private", "size": size, "device": "cpu"})
        fds.append(fd)
    device_images = []
    for device in sorted({str(t.device) for t in parameters if t.device.type == "cuda"}):
        from .cuda_handles import DeviceImage

        members = [t for t in parameters if str(t.device) == device and t.numel()]
        storages = {t.untyped_storage().data_ptr(): t for t in members}
        offsets, size = {}, 0
        for key, tensor in storages.items():
            offsets[key] = size
            size += -(-tensor.untyped_storage().nbytes() // WeightImage.ALIGN) * WeightImage.ALIGN
        target = DeviceImage.create(torch.device(device).index or 0, size)
        whole = target.tensor(0, target.size)
        with torch.no_grad():
            for key, tensor in storages.items():
                raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
                whole[offsets[key]:offsets[key] + raw.numel()].copy_(raw)
            torch.cuda.synchronize(device)
            # The host's own parameters now live in the exported allocation.
            point_into(members, whole, offsets)
        torch.cuda.empty_cache()
        # Every parameter of this device now shares the image's one storage.
        places[whole.untyped_storage().data_ptr()] = (len(images), 0)
        images.append({"kind": "cuda", "size": target.size, "device": device})
        fds.append(target.export())
        device_images.append(target)
    entries = []
    for name, kind, tensor in named:
        entry: dict[str, Any] = {
            "name": name, "kind": kind, "dtype": str(tensor.dtype).removeprefix("torch."),
            "size": list(tensor.size()), "stride": list(tensor.stride()),
            "storage_offset": tensor.storage_offset(), "device": str(tensor.device),
            "requires_grad": bool(tensor.requires_grad) if kind == PARAMETER else False,
        }
        if tensor.numel() == 0:
            entry["image"] = -1
        else:
            # A device image is one storage, so its storage_offset already says where.
            entry["image"], entry["offset"] = places[tensor.untyped_storage().data_ptr()]
            entry["nbytes"] = tensor.untyped_storage().nbytes()
        entries.append(entry)
    layout = json.dumps({"images": images, "tensors": entries}).encode()
    fds.append(_sealed(layout))
    return ExportedWeights(fds, len(entries), [image["size"] for image in images], device_images)


def point_into(members: list[Any], whole: Any, offsets: dict[int, int]) -> None:
    """Re-point each parameter at its bytes in ``whole``, one storage that holds them all.

    ``offsets`` maps each member's storage (by its pointer) to where its bytes
    start in ``whole``. Every start is read before any parameter moves: a tied
    parameter is one object listed under each of its names, and once moved
    its storage is no longer one ``offsets`` knows (an H200 showed it as a
    ``KeyError`` on GPT-2's tied embedding). Each object is moved once.
    """
    import torch

    starts: dict[int, tuple[Any, int]] = {}
    for tensor in members:
        starts.setdefault(id(tensor), (tensor, offsets[tensor.untyped_storage().data_ptr()]))
    for tensor, start in starts.values():
        tensor.data = torch.empty(0, dtype=tensor.dtype, device=whole.device).set_(
            whole.untyped_storage(), start // tensor.element_size() + tensor.storage_offset(),
            tensor.size(), tensor.stride())


def _sealed(data: bytes) -> int:
    fd = os.memfd_create("nnhost-weight-layout", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    seal(fd)
    return fd


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0)


def _open_images(images: list[dict[str, Any]], fds: list[int]) -> list[Any]:
    """Each image mapped into this process: memfds as mmaps, device images as whole-image tensors."""
    import torch

    opened: list[Any] = []
    for spec, fd in zip(images, fds):
        if spec["kind"] == "shared":
            opened.append(mmap.mmap(fd, spec["size"], mmap.MAP_SHARED, mmap.PROT_READ))
        elif spec["kind"] == "private":
            opened.append(mmap.mmap(fd, spec["size"], mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
                          if spec["size"] else None)
        elif spec["kind"] == "cuda":
            from .cuda_handles import DeviceImage

            device = torch.device(spec["device"])
            torch.cuda.set_device(device)  # this process's own context, made now
            image = DeviceImage.open(device.index or 0, fd, spec["size"])
            opened.append(image.tensor(0, image.size))
        else:
            raise RuntimeError(f"unknown image kind {spec['kind']!r}")
    return opened


def bind(model: Any, fds: list[int]) -> int:
    """In a job's process: map the host's weights and put them into this process's tree.

    Returns how many tensors were bound. The descriptors stay open (the
    caller closes them with everything else it does not keep).
    """
    import torch

    layout = json.loads(_read_all(fds[-1]))
    images = layout["images"]
    opened = _open_images(images, fds[:-1])
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
                new = made[id(old)] = _tensor(entry, dtype, images, opened, storages)
            setattr(owner, leaf, new)
    left = [name for name, _, tensor in _named_tensors(root) if tensor.device.type == "meta"]
    if left:
        raise RuntimeError(f"no weights arrived for {', '.join(left[:5])}: the mapped design cannot serve this model")
    return len(made)


def _tensor(
    entry: dict[str, Any],
    dtype: Any,
    images: list[dict[str, Any]],
    opened: list[Any],
    storages: dict[tuple[int, int], Any],
) -> Any:
    import torch

    index = entry["image"]
    if index < 0:
        tensor = torch.empty_strided(entry["size"], entry["stride"], dtype=dtype, device=entry["device"])
    elif images[index]["kind"] == "cuda":
        # The whole image is one storage; the entry's offset was folded into storage_offset.
        whole = opened[index]
        tensor = torch.empty(0, dtype=dtype, device=whole.device).set_(
            whole.untyped_storage(), entry["storage_offset"], entry["size"], entry["stride"])
    else:
        key = (index, entry["offset"])
        storage = storages.get(key)
        if storage is None:
            buffer = opened[index]
            if buffer is None:
                raise RuntimeError(f"no image holds {entry['name']}")
            view = torch.frombuffer(buffer, dtype=torch.uint8, count=entry["nbytes"], offset=entry["offset"])
            storage = storages[key] = view.untyped_storage()
        tensor = torch.empty(0, dtype=dtype).set_(storage, entry["storage_offset"], entry["size"], entry["stride"])
        if entry["device"] != "cpu":
            tensor = tensor.to(entry["device"])  # a buffer of a device: this job's own copy there
    if entry["kind"] == PARAMETER:
        tensor = torch.nn.Parameter(tensor, requires_grad=entry["requires_grad"])
    return tensor


@contextlib.contextmanager
def stand_ins(model: Any) -> Iterator[None]:
    """For the template's warm-up: every meta tensor of the tree as zeros that take no memory.

    Each stand-in is one zero element broadcast to the tensor's shape (stride
    0), on the CPU, so a forward pass runs (to zeros) without a weight in the
    process and without a device. The meta tensors are put back after.
    """
    import torch

    root = model._module
    kept: list[tuple[Any, str, Any]] = []
    made: dict[int, Any] = {}
    try:
        with torch.no_grad():
            for name, kind, tensor in _named_tensors(root):
                if tensor.device.type != "meta":
                    continue
                owner_name, _, leaf = name.rpartition(".")
                owner = root.get_submodule(owner_name) if owner_name else root
                stand_in = made.get(id(tensor))
                if stand_in is None:
                    stand_in = torch.zeros((), dtype=tensor.dtype).expand(tensor.shape)
                    if kind == PARAMETER:
                        stand_in = torch.nn.Parameter(stand_in, requires_grad=False)
                    made[id(tensor)] = stand_in
                kept.append((owner, leaf, tensor))
                setattr(owner, leaf, stand_in)
        yield
    finally:
        for owner, leaf, tensor in reversed(kept):
            setattr(owner, leaf, tensor)

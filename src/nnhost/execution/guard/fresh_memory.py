"""Memory a request allocates never shows an earlier request's values.

``torch.empty`` and its family hand back memory without clearing it. A job
that has a process of its own on the CPU (`job.process`) cannot meet another
request's values that way: its process was forked from a host that never ran
user code, and what the kernel gives it is zeroed. What crosses requests is
PyTorch's own caches: the CUDA caching allocator and the pinned-host
allocator keep freed blocks and give them to the next allocation of that
size, and a process that serves more than one request keeps its heap. So
where either can happen (`blanking_needed`: an accelerator this torch can
reach, weights to protect, or a process that outlives its job), `job_memory`
puts a dispatch mode on torch's stack while the job runs (it sees every aten
operation, whatever Python spelling reached it: ``torch.empty``,
``empty_like``, ``new_empty``, ``empty_strided``, ``Tensor.resize_``,
``torch.Tensor(n)``, the legacy typed constructors, ``torch.ops.aten.empty``)
and fills what those return with zeros; a ``resize_`` that grows a storage
gets its new tail zeroed. Storages built from a size (``torch.UntypedStorage(n)``,
``TypedStorage``, ``FloatStorage(n)``) and a storage's own ``resize_``, which
do not pass through the dispatcher, are zeroed by patched methods, and
``numpy.empty``/``empty_like`` (numpy caches small freed buffers outside
malloc) return zeros, in every process.

The mode is not free: every aten operation of the job goes through Python
(on a small model it doubled the forward pass), which is why a job's own
process on a CPU-only torch goes without it.

While it is on, the mode also zeroes the few ``empty`` calls the model's own
forward pass makes from Python: those are the job's own allocations, and
zeroing them costs one memset each. Most intermediate tensors are allocated
inside aten kernels, below the dispatcher, and are entirely written by the
kernel before anyone can read them.

The same mode refuses in-place writes (``add_``, ``copy_``, ``out=``, through
``.data`` or any view) into the storages it is told to protect: the weights
held on an accelerator, which cannot be mapped read-only as the CPU weights
are (`weights.WeightImage`). The write is refused before it happens, so the
model never changes and nothing needs restarting.

Between jobs `release_cached_memory` returns the CUDA and pinned-host caches'
free blocks, so a later job's allocations do not start from them.

It must never change what a program computes: zeros where the values were
undefined, and errors only for writes into the shared weights.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Optional, cast

_EMPTY_PACKETS = (
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
    "empty_permuted", "empty_quantized", "_empty_affine_quantized",
    "_empty_per_channel_affine_quantized",
)
_RESIZE_PACKETS = ("resize_", "resize_as_")


class WeightWriteRefused(RuntimeError):
    """User code tried to write into the shared model's weights."""


def _overloads(names: Iterable[str]) -> set[Any]:
    import torch

    found: set[Any] = set()
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            found.add(getattr(packet, overload))
    return found


def _zero_storage(tensor: Any, start: int = 0) -> None:
    """Zero the bytes of ``tensor``'s storage from ``start`` on (all of them by default)."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.is_meta or tensor.layout != torch.strided:
        return
    storage = tensor.untyped_storage()
    size = storage.nbytes()
    if size <= start:
        return
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    raw.set_(storage, 0, (size,), (1,))
    raw[start:].zero_()


def _writes(func: Any) -> tuple[tuple[int, str], ...]:
    """(position, name) of the arguments ``func`` writes into, from its schema."""
    written = []
    for index, argument in enumerate(func._schema.arguments):
        info = argument.alias_info
        if info is not None and info.is_write:
            written.append((index, argument.name))
    return tuple(written)


def _tensors(value: Any) -> Iterator[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, torch.Tensor):
                yield item


def _make_mode_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    empties = _overloads(_EMPTY_PACKETS)
    resizes = _overloads(_RESIZE_PACKETS)

    class BlankAllocations(TorchDispatchMode):  # type: ignore[no-untyped-call]
        """Zero what the empty family returns; refuse writes into protected storages."""

        def __init__(self, protected: frozenset[int]) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.protected = protected
            self.plans: dict[Any, tuple[tuple[int, str], ...]] = {}

        def __torch_dispatch__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Optional[dict[str, Any]] = None
        ) -> Any:
            kwargs = kwargs or {}
            if func in empties:
                result = func(*args, **kwargs)
                _zero_storage(result)
                return result
            if func in resizes:
                target = args[0]
                before = target.untyped_storage().nbytes()
                result = func(*args, **kwargs)
                _zero_storage(target, before)
                return result
            if self.protected:
                plan = self.plans.get(func)
                if plan is None:
                    plan = self.plans[func] = _writes(func)
                for index, name in plan:
                    value = args[index] if index < len(args) else kwargs.get(name)
                    for tensor in _tensors(value):
                        if tensor.untyped_storage().data_ptr() in self.protected:
                            raise WeightWriteRefused(
                                f"{func.__name__.split('.')[0]} would write into the model's weights, which are "
                                "read-only on this server: work on a copy (`weight.clone()`) or "
                                "change activations instead."
                            )
            return func(*args, **kwargs)

    return BlankAllocations


_MODE_CLASS: Optional[type] = None
_PATCHED = False


def _patch_constructors() -> None:
    """Storages made from a size, and numpy's empties, come back zeroed (once per process)."""
    global _PATCHED
    if _PATCHED:
        return
    _PATCHED = True
    import torch

    base_new = torch._C.StorageBase.__new__

    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
        storage = base_new(cls, *args, **kwargs)
        if args and isinstance(args[0], int) and not isinstance(args[0], bool) and storage.nbytes():
            if storage.device.type != "meta":
                storage.fill_(0)
        return storage

    cast(Any, torch.UntypedStorage).__new__ = __new__
    base_resize = torch.UntypedStorage.resize_

    def resize_(self: Any, size: Any) -> Any:
        # A storage's own resize_ goes below the dispatcher on the CPU.
        before = self.nbytes()
        result = base_resize(self, size)
        if self.nbytes() > before and self.device.type != "meta":
            raw = torch.empty(0, dtype=torch.uint8, device=self.device)
            raw.set_(self, 0, (self.nbytes(),), (1,))
            raw[before:].zero_()
        return result

    cast(Any, torch.UntypedStorage).resize_ = resize_
    try:
        import numpy
    except ImportError:
        return

    def empty(shape: Any, dtype: Any = float, order: Any = "C", *, device: Any = None, like: Any = None) -> Any:
        extra: dict[str, Any] = {} if like is None else {"like": like}
        if device is not None:
            extra["device"] = device
        return numpy.zeros(shape, dtype, order, **extra)

    def empty_like(
        prototype: Any, dtype: Any = None, order: Any = "K", subok: Any = True, shape: Any = None, *, device: Any = None
    ) -> Any:
        extra = {} if device is None else {"device": device}
        return numpy.zeros_like(prototype, dtype, order, subok, shape, **extra)

    # As the server, before any module refuses writes from user code.
    cast(Any, numpy).empty = empty
    cast(Any, numpy).empty_like = empty_like


def protected_storages(tensors: Iterable[Any]) -> frozenset[int]:
    """The storage addresses of ``tensors`` that are not in host memory."""
    pointers: set[int] = set()
    for tensor in tensors:
        if tensor.device.type in ("cpu", "meta"):
            continue
        pointer = tensor.untyped_storage().data_ptr()
        if pointer:
            pointers.add(pointer)
    return frozenset(pointers)


def prepare() -> None:
    """Patch the constructors now (call before user code can reach them)."""
    global _MODE_CLASS
    _patch_constructors()
    if _MODE_CLASS is None:
        _MODE_CLASS = _make_mode_class()


def accelerator_reachable() -> bool:
    """Whether this torch build has an accelerator's allocator (CUDA, ROCm, XPU, MPS) at all.

    Asked of the build, not the machine: asking for a device starts its
    driver, which no process forked after can use (see `memory_meter`).
    """
    import torch

    version = torch.version
    built = bool(version.cuda or version.hip or getattr(version, "xpu", None))
    return built or bool(torch.backends.mps.is_built())


def blanking_needed(protected: frozenset[int], sole_job: bool) -> bool:
    """Whether a job must run under the mode: it has something to protect, or a cache to come from.

    ``sole_job``: this process runs this one job and exits (`job.process`).
    """
    return bool(protected) or not sole_job or accelerator_reachable()


@contextlib.contextmanager
def job_memory(protected: frozenset[int] = frozenset(), sole_job: bool = False) -> Iterator[None]:
    """While a job runs: blank allocations, and no writes into ``protected`` storages.

    Where `blanking_needed` says neither can matter, the job runs without the mode.
    """
    if not blanking_needed(protected, sole_job):
        yield
        return
    prepare()
    assert _MODE_CLASS is not None
    with _MODE_CLASS(protected):
        yield


def release_cached_memory() -> None:
    """Return the CUDA and pinned-host caches' free blocks after a job."""
    import torch

    # Never is_available() here: it would start the driver in a process that forks (see memory_meter).
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        host_empty = getattr(torch._C, "_host_emptyCache", None)
        if host_empty is not None:
            host_empty()

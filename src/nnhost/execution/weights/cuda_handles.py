"""Device memory that crosses processes by descriptor: the CUDA half of the mapped design.

The handles ``torch.multiprocessing`` uses for CUDA tensors
(``cudaIpcGetMemHandle``) do not cross PID namespaces, and every job's
process is PID 1 of its own. The driver's virtual-memory API does, because
its handle is a file descriptor, which travels over the job's channel like
the CPU weights' memfds:

* in the host (which holds the weights): `DeviceImage.create` makes one
  physical allocation per device with ``cuMemCreate``, asking for a POSIX
  file-descriptor handle type, maps it into the host's address space
  (``cuMemAddressReserve``, ``cuMemMap``, ``cuMemSetAccess`` read-write),
  and the caller copies the weights in; ``export`` gives the descriptor
  (``cuMemExportToShareableHandle``);
* in a job's process (which has created its own context, never inherited
  one): `DeviceImage.open` imports the descriptor
  (``cuMemImportFromShareableHandle``), maps it and grants this device
  **read-only** access (``cuMemSetAccess`` with ``CU_MEM_ACCESS_FLAGS_PROT_READ``):
  a kernel that writes into a weight faults, and the job's process dies with
  its context, as a write into the CPU weights' read-only pages does.

`tensor` wraps a range of a mapping as a torch tensor through
``__cuda_array_interface__`` (no copy). The struct layouts and enum values
are those of ``cuda.h`` (CUDA 11.2 and later); each call's result is checked
and a failure raises `CudaError` naming the call and the driver's error name.

It must never be imported in the template (`template`): loading the driver
there would make every fork unsafe. Nothing here runs user code.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_MEM_ACCESS_FLAGS_PROT_READ = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class CudaError(RuntimeError):
    """A driver call failed."""


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_driver: Optional[ctypes.CDLL] = None


def driver() -> ctypes.CDLL:
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
        _check(_driver.cuInit(0), "cuInit")
    return _driver


def _check(result: int, call: str) -> None:
    if result == 0:
        return
    name = ctypes.c_char_p()
    try:
        assert _driver is not None
        _driver.cuGetErrorName(result, ctypes.byref(name))
    except Exception:
        pass
    raise CudaError(f"{call} failed: {(name.value or b'').decode() or result}")


def _current_context(device: int) -> None:
    """Make ``device``'s primary context current on this thread (torch's own, made if need be).

    Every virtual-memory call acts in the thread's current context, and a
    thread torch has not used on this device has none; the primary context is
    the one the runtime, so torch, uses, so both see the same mappings.
    """
    cuda = driver()
    current = ctypes.c_void_p()
    _check(cuda.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    handle = ctypes.c_int()
    _check(cuda.cuDeviceGet(ctypes.byref(handle), device), "cuDeviceGet")
    context = ctypes.c_void_p()
    _check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle), "cuDevicePrimaryCtxRetain")
    if current.value != context.value:
        _check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, device)
    return prop


def granularity(device: int) -> int:
    value = ctypes.c_size_t()
    prop = _prop(device)
    _check(driver().cuMemGetAllocationGranularity(
        ctypes.byref(value), ctypes.byref(prop), CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity")
    return value.value


class DeviceImage:
    """One device allocation mapped into this process (the host's read-write, a job's read-only)."""

    def __init__(self, device: int, size: int, handle: int, address: int) -> None:
        self.device = device
        self.size = size
        self.handle = handle
        self.address = address

    @classmethod
    def create(cls, device: int, nbytes: int) -> "DeviceImage":
        """In the host: a new allocation of at least ``nbytes`` on ``device``, mapped read-write."""
        _current_context(device)
        step = granularity(device)
        size = max(step, -(-nbytes // step) * step)
        handle = ctypes.c_ulonglong()
        prop = _prop(device)
        _check(driver().cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop),
                                    ctypes.c_ulonglong(0)), "cuMemCreate")
        return cls._mapped(device, size, handle.value, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)

    @classmethod
    def open(cls, device: int, fd: int, size: int) -> "DeviceImage":
        """In a job's process: the host's allocation behind ``fd``, mapped read-only."""
        _current_context(device)
        handle = ctypes.c_ulonglong()
        # The POSIX descriptor is passed as the pointer's value, not through memory.
        _check(driver().cuMemImportFromShareableHandle(
            ctypes.byref(handle), ctypes.c_void_p(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle")
        return cls._mapped(device, size, handle.value, CU_MEM_ACCESS_FLAGS_PROT_READ)

    @classmethod
    def _mapped(cls, device: int, size: int, handle: int, access: int) -> "DeviceImage":
        cuda = driver()
        address = ctypes.c_ulonglong()
        _check(cuda.cuMemAddressReserve(ctypes.byref(address), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                        ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        _check(cuda.cuMemMap(ctypes.c_ulonglong(address.value), ctypes.c_size_t(size), ctypes.c_size_t(0),
                             ctypes.c_ulonglong(handle), ctypes.c_ulonglong(0)), "cuMemMap")
        desc = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, device), access)
        _check(cuda.cuMemSetAccess(ctypes.c_ulonglong(address.value), ctypes.c_size_t(size),
                                   ctypes.byref(desc), ctypes.c_size_t(1)), "cuMemSetAccess")
        return cls(device, size, handle, address.value)

    def export(self) -> int:
        """A new descriptor for the allocation (the caller closes it once sent)."""
        fd = ctypes.c_int(-1)
        _check(driver().cuMemExportToShareableHandle(
            ctypes.byref(fd), ctypes.c_ulonglong(self.handle), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            ctypes.c_ulonglong(0)), "cuMemExportToShareableHandle")
        return fd.value

    def tensor(self, offset: int, nbytes: int) -> Any:
        """``nbytes`` at ``offset`` of the mapping as a uint8 torch tensor on this device (no copy)."""
        import torch

        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"range {offset}+{nbytes} is outside the {self.size}-byte image")
        view = _ArrayInterface(self.address + offset, nbytes, read_only=False)
        return torch.as_tensor(view, device=f"cuda:{self.device}")


class _ArrayInterface:
    """The smallest object torch.as_tensor reads as device memory."""

    def __init__(self, address: int, nbytes: int, read_only: bool) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (address, read_only), "version": 2,
            "strides": None,
        }


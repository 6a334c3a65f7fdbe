"""How much memory a model will take, known before it is loaded.

Placing a model needs its size before anything is loaded. The safetensors
format states each tensor's dtype and shape in a small JSON header at the start
of the file, so the API process reads only the headers (never the weights) and
counts elements, then prices them in the dtype the deployment will hold them
in. A checkpoint without safetensors falls back to the size of its weight files.
A margin covers what weights alone do not (activations, allocator slack).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Optional, Sequence

_SAFETENSORS_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I8": 1, "U8": 1, "BOOL": 1,
}
_TORCH_BYTES = {
    "float64": 8, "float32": 4, "float": 4, "float16": 2, "half": 2,
    "bfloat16": 2, "int8": 1, "uint8": 1, "float8_e4m3fn": 1,
}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")

#: Nominal bytes per weight of the quantization names nnsight 0.8.1 takes in
#: ``dtype`` (its ``modeling.quantization.QUANTIZATIONS``; the API process
#: never imports nnsight, so the widths are repeated here and checked against
#: nnsight's table by the tests). Norms, biases and embeddings stay at the
#: compute dtype.
QUANTIZATION_BYTES = {
    "nf4": 0.5, "int4": 0.5, "4bit": 0.5, "fp4": 0.5, "int8": 1.0, "8bit": 1.0, "fp8": 1.0,
}
_UNQUANTIZED = ("embed", "wte", "wpe", "lm_head", "norm", "ln_")

#: Values a string ``device_map`` may take (accelerate's strategies).
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        if length > 100 * 1024 * 1024:
            raise ValueError(f"{path.name}: implausible safetensors header length")
        header: dict[str, Any] = json.loads(file.read(length))
        return header


def _width(name: Optional[str]) -> Optional[float]:
    name = (name or "").removeprefix("torch.").lower()
    return QUANTIZATION_BYTES.get(name) or _TORCH_BYTES.get(name)


def pipeline_components(snapshot: Path) -> list[str]:
    """The folders of a diffusers pipeline's components (``model_index.json``); [] for a model.

    A pipeline keeps each component's weights in its own folder (``unet/``,
    ``vae/``, ``text_encoder/``), none at the top, so sizing only the top would
    price the whole pipeline at nothing.
    """
    try:
        index = json.loads((snapshot / "model_index.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(index, dict):
        return []
    return sorted(
        name for name, entry in index.items()
        if not name.startswith("_") and isinstance(entry, list) and len(entry) == 2
        and entry[0] is not None and "/" not in name and name not in (".", "..")
        and (snapshot / name).is_dir()
    )


def tensor_bytes(snapshot: Path, dtype: Optional[str] = None) -> dict[str, int]:
    """Bytes each tensor takes held as ``dtype`` (a torch dtype or a quantization name).

    A checkpoint without safetensors headers gives one entry per weight file. A
    diffusers pipeline is the sum of its components, each tensor named
    ``component/tensor``.
    """
    components = pipeline_components(snapshot)
    if components:
        return {
            f"{component}/{name}": size
            for component in components
            for name, size in tensor_bytes(snapshot / component, dtype).items()
        }
    files = sorted(snapshot.glob("*.safetensors"))
    if not files:
        return {p.name: p.stat().st_size for p in snapshot.iterdir() if p.suffix in _WEIGHT_SUFFIXES}
    sizes: dict[str, int] = {}
    for path in files:
        sizes.update(header_bytes(_header(path), dtype))
    return sizes


def header_bytes(header: dict[str, Any], dtype: Optional[str] = None) -> dict[str, int]:
    """Bytes each tensor of one safetensors header takes held as ``dtype``.

    The header may come from a file on disk or from a range read of a remote one
    (`models.downloader`): an entry that is not a tensor's raises ValueError.
    """
    target = _width(dtype)
    quantized = (dtype or "").lower() in QUANTIZATION_BYTES
    sizes: dict[str, int] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list) or not all(
            isinstance(extent, int) and extent >= 0 for extent in entry["shape"]
        ):
            raise ValueError(f"tensor {name!r} has no valid shape in its safetensors header")
        elements = 1
        for extent in entry["shape"]:
            elements *= extent
        kind = str(entry.get("dtype"))
        stored = _SAFETENSORS_BYTES.get(kind, 4)
        # Integer tensors (e.g. position ids) keep their dtype whatever the weights become.
        floating = kind in ("F64", "F32", "F16", "BF16")
        width: float = stored
        if target and floating:
            width = target
            if quantized and (len(entry["shape"]) < 2 or any(p in name for p in _UNQUANTIZED)):
                width = 2  # held at the compute dtype (bfloat16)
        sizes[name] = int(elements * width)
    return sizes


def weight_bytes(snapshot: Path, dtype: Optional[str] = None) -> int:
    """Bytes the weights take held as ``dtype`` (their stored dtypes when None)."""
    return sum(tensor_bytes(snapshot, dtype).values())


def normalise_device(device: "str | int") -> str:
    """``0`` and ``"0"`` are ``"cuda:0"``; ``"cuda"`` is ``"cuda:0"``; others as written."""
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    text = str(device).strip()
    if text.isdigit():
        return f"cuda:{text}"
    return "cuda:0" if text == "cuda" else text


def device_shares(
    sizes: dict[str, int], device_map: "str | dict[str, str | int] | None",
    devices: Sequence[str | int], default: str,
) -> dict[str, int]:
    """Bytes of the weights on each device under ``device_map``.

    An explicit map (module name to device) is priced tensor by tensor, by the
    longest module prefix that names it (a checkpoint's names may lack the
    model's base prefix, ``transformer.``); tensors no entry names go to the
    map's first device. A strategy ("auto", "balanced", ...) is priced as an
    even split over ``devices``: give an explicit map for exact shares.
    """
    total = sum(sizes.values())
    if device_map is None:
        return {normalise_device(default): total}
    if isinstance(device_map, str):
        spread = [normalise_device(d) for d in devices] or [normalise_device(default)]
        share = -(-total // len(spread))
        return {device: share for device in spread}
    entries = sorted(
        ((key, normalise_device(value)) for key, value in device_map.items()),
        key=lambda item: -len(item[0]),
    )
    first = normalise_device(next(iter(device_map.values())))
    shares = {device: 0 for _, device in entries}
    for name, size in sizes.items():
        target = first
        for key, device in entries:
            stripped = key.split(".", 1)[1] if "." in key else ""
            if key == "" or any(
                candidate and (name == candidate or name.startswith(candidate + "."))
                for candidate in (key, stripped)
            ):
                target = device
                break
        shares[target] = shares.get(target, 0) + size
    return shares


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def jobs_per_replica(requested: int, device: str = "cpu", cores: Optional[int] = None) -> int:
    """How many jobs one replica of a model on ``device`` runs at once, each in a process of its own.

    Run one job at a time, a replica's next job process waits between two
    jobs for the server to record the first and dispatch the second, and a
    small trace cannot use many cores: the cores go to jobs, not to threads.
    Even on two cores two at once did no worse (8 clients, the tiny test
    model, rounds side by side; jobs/s one at a time against two at once:
    fork 17.2 and 20.2 against 20.0 and 21.7 in one run, 18.5 and 18.5
    against 18.7 and 18.5 in another, where mapped got 15.0 and 16.7 against
    17.5 and 17.3).
    So, unless the operator asked for a number: half the cores, at least two,
    on the CPU. On an accelerator one: each job's activations take the
    device's memory, which its budget does not count twice.
    """
    if requested > 0:
        return requested
    if device != "cpu":
        return 1
    cores = _cores() if cores is None else cores
    return max(2, cores // 2)


def threads_per_job(requested: int, concurrent_jobs: int, cores: Optional[int] = None) -> int:
    """How many threads torch may use in each job process.

    Every replica runs its jobs (`jobs_per_replica` at once), and they all share the machine with
    the API process. Giving each job all the cores (torch's own default)
    oversubscribes them as soon as two jobs, or a job and the API, run at once:
    OpenMP's spinning threads then wait on descheduled peers, and throughput
    under load fell to a third. So, unless the operator asked for a number, the
    cores minus one for the API are split evenly between the jobs that can run
    at once, never fewer than one each.
    """
    if requested > 0:
        return requested
    cores = _cores() if cores is None else cores
    return max(1, (cores - 1) // max(1, concurrent_jobs))

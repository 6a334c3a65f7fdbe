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
from typing import Optional

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


def _header(path: Path) -> dict:
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        if length > 100 * 1024 * 1024:
            raise ValueError(f"{path.name}: implausible safetensors header length")
        return json.loads(file.read(length))


def weight_bytes(snapshot: Path, dtype: Optional[str] = None) -> int:
    """Bytes the weights take held as ``dtype`` (their stored dtypes when None)."""
    files = sorted(snapshot.glob("*.safetensors"))
    if not files:
        return sum(p.stat().st_size for p in snapshot.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    target = _TORCH_BYTES.get((dtype or "").removeprefix("torch.").lower())
    total = 0
    for path in files:
        for name, entry in _header(path).items():
            if name == "__metadata__":
                continue
            elements = 1
            for extent in entry["shape"]:
                elements *= extent
            stored = _SAFETENSORS_BYTES.get(entry["dtype"], 4)
            # Integer tensors (e.g. position ids) keep their dtype whatever the weights become.
            floating = entry["dtype"] in ("F64", "F32", "F16", "BF16")
            total += elements * (target if target and floating else stored)
    return total

"""Which PEFT adapters this server serves, and where their files are.

A request may name a PEFT adapter in its ``env`` (``TransformersModel(repo,
peft=ADAPTER)``); the server applies it for that one job. An adapter is served
when the operator put it in the server's model cache (the Hugging Face cache
layout, `hfcache`): a snapshot holding ``adapter_config.json`` and
``adapter_model.safetensors``. Nothing else in the cache counts as an adapter,
and the id must be a Hub-style ``org/name``, never a path.

Only the trusted side of the server reads this: the controller checks a job's
adapter before dispatch, the replica opens its files for the job's process
(`execution.handoff`), the Hub mirror serves its config to clients. A job's
own process never sees the cache. Weights in pickle form (``adapter_model.bin``)
are never served: loading them would run whatever the pickle says.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

from .hfcache import find_snapshot, hub_cache_dir

#: The files of a served adapter, in the order they are handed to a job.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: Largest adapter a job is handed (config and weights together).
MAX_ADAPTER_BYTES = 2 * 1024**3
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


class UnknownAdapter(LookupError):
    """The request names an adapter this server does not serve."""


def adapter_id_of(env: Any) -> Optional[str]:
    """The adapter a request's ``env`` names, or None; a malformed name is `UnknownAdapter`."""
    if not isinstance(env, dict) or env.get("peft") is None:
        return None
    adapter = env["peft"]
    if not isinstance(adapter, str) or not _REPO_ID.fullmatch(adapter) or ".." in adapter:
        raise UnknownAdapter(
            f"The PEFT adapter {str(adapter)[:100]!r} is not a Hub id of the form 'org/name'; "
            "this server applies only adapters it serves, by their Hub id."
        )
    return adapter


def find_adapter(adapter_id: str, hf_home: Optional[os.PathLike[str]] = None) -> Optional[Path]:
    """The snapshot of a served adapter, or None.

    Its files must resolve inside its own repo folder (the cache's links into
    ``blobs/``), so a link planted in the cache cannot hand a job another file.
    """
    snapshot = find_snapshot(adapter_id, None, hf_home)
    if snapshot is None:
        return None
    repo = snapshot.parent.parent.resolve()
    for name in ADAPTER_FILES:
        path = snapshot / name
        try:
            real = path.resolve(strict=True)
        except OSError:
            return None
        if not real.is_file() or repo not in real.parents:
            return None
    return snapshot


def served_adapters(hf_home: Optional[os.PathLike[str]] = None) -> list[str]:
    """The ids of every adapter in the cache (for a refusal that says what there is)."""
    hub = hub_cache_dir(hf_home)
    names = []
    for folder in sorted(hub.glob("models--*--*")):
        adapter_id = folder.name[len("models--"):].replace("--", "/", 1)
        if _REPO_ID.fullmatch(adapter_id) and find_adapter(adapter_id, hf_home) is not None:
            names.append(adapter_id)
    return names


def check_adapter(env: Any, hf_home: Optional[os.PathLike[str]] = None) -> Optional[Path]:
    """The snapshot of the adapter ``env`` names (None if it names none), or `UnknownAdapter`."""
    adapter_id = adapter_id_of(env)
    if adapter_id is None:
        return None
    snapshot = find_adapter(adapter_id, hf_home)
    if snapshot is None:
        served = ", ".join(served_adapters(hf_home)) or "none"
        raise UnknownAdapter(
            f"The PEFT adapter {adapter_id!r} is not served here: it is not in this server's "
            f"model cache. Adapters served here: {served}."
        )
    size = sum((snapshot / name).stat().st_size for name in ADAPTER_FILES)
    if size > MAX_ADAPTER_BYTES:
        raise UnknownAdapter(f"The PEFT adapter {adapter_id!r} is too large to apply per request.")
    return snapshot


def read_adapter(snapshot: "str | os.PathLike[str]") -> dict[str, bytes]:
    """A served adapter's files, to send to a node that has no copy of the cache (Ray)."""
    return {name: (Path(snapshot) / name).read_bytes() for name in ADAPTER_FILES}


def write_adapter(folder: "str | os.PathLike[str]", files: Any) -> Path:
    """Lay out what `read_adapter` sent in ``folder``; only the adapter's own file names."""
    if not isinstance(files, dict) or set(files) != set(ADAPTER_FILES) or not all(
        isinstance(data, bytes) for data in files.values()
    ) or sum(len(data) for data in files.values()) > MAX_ADAPTER_BYTES:
        raise ValueError("the adapter's files did not arrive whole")
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=False)
    for name in ADAPTER_FILES:
        (target / name).write_bytes(files[name])
    return target

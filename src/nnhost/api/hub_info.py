"""The Hub's JSON bodies for a hosted snapshot: its model info and tree listings.

Why it exists: `huggingface_hub` (and, through it, nnsight's model key and
`transformers`) reads a repo's description from these bodies: ``id``,
``sha``, ``siblings``, ``pipeline_tag``, ``config``, ``safetensors``
parameter counts, and folder listings with each file's blob id and LFS info.
This module builds them, in the shapes the Hub uses, from a `Snapshot` of
`nnhost.api.hub_files`; `nnhost.api.hub` sends them.

What it must never do:

* never open a file the `Snapshot` did not hand it: which files exist, and
  whether weights are among them, is entirely the snapshot's answer;
* never read weights: a model's parameter counts come from the safetensors
  headers alone, and only ``config.json``, ``tokenizer_config.json`` and the
  model card's header are otherwise read;
* never know HTTP: it returns plain dicts and lists, and fails by raising.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Optional

from .hub_files import FileIds, Snapshot, split_relative

__all__ = ["model_info", "tree"]

# Architecture-class suffix -> the Hub's pipeline tag.
_ARCH_PIPELINES: tuple[tuple[str, str], ...] = (
    ("ForCausalLM", "text-generation"),
    ("LMHeadModel", "text-generation"),
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMaskedLM", "fill-mask"),
)
_PIPELINE_AUTO = {
    "text-generation": "AutoModelForCausalLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "fill-mask": "AutoModelForMaskedLM",
}


def _read_json(path: Optional[Path]) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _card_metadata(readme: Optional[Path]) -> dict[str, Any]:
    """``pipeline_tag``, ``library_name`` and ``tags`` from a model card's header."""
    if readme is None:
        return {}
    try:
        text = readme.read_text(encoding="utf-8", errors="replace")[:20000]
    except OSError:
        return {}
    match = re.match(r"---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not match:
        return {}
    found: dict[str, Any] = {}
    lines = match.group(1).splitlines()
    for index, line in enumerate(lines):
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip().strip("'\"")
        if key in ("pipeline_tag", "library_name") and value and not line.startswith(" "):
            found[key] = value
        elif key == "tags" and not line.startswith(" "):
            tags = []
            for item in lines[index + 1 :]:
                if not item.lstrip().startswith("- "):
                    break
                tags.append(item.strip()[2:].strip().strip("'\""))
            found["tags"] = [t for t in tags if t]
    return found


def _pipeline_tag(config: dict[str, Any]) -> Optional[str]:
    explicit = config.get("pipeline_tag")
    if isinstance(explicit, str) and explicit:
        return explicit
    architectures = config.get("architectures") or []
    for arch in architectures if isinstance(architectures, list) else []:
        for suffix, tag in _ARCH_PIPELINES:
            if isinstance(arch, str) and arch.endswith(suffix):
                return tag
    return None


def _safetensors_parameters(paths: list[Path]) -> Optional[dict[str, Any]]:
    """Parameter counts by dtype, read from safetensors headers (no weights read)."""
    counts: dict[str, int] = {}
    for path in paths:
        try:
            with open(path, "rb") as handle:
                length = int.from_bytes(handle.read(8), "little")
                if length <= 0 or length > 100 * 1024 * 1024:
                    return None
                header = json.loads(handle.read(length))
        except (OSError, ValueError):
            return None
        try:
            for name, tensor in header.items():
                if name == "__metadata__" or not isinstance(tensor, dict):
                    continue
                count = 1
                for dim in tensor.get("shape", []):
                    count *= int(dim)
                dtype = str(tensor.get("dtype", "UNKNOWN"))
                counts[dtype] = counts.get(dtype, 0) + count
        except (AttributeError, TypeError, ValueError):
            return None
    if not counts:
        return None
    return {"parameters": counts, "total": sum(counts.values())}


def _iso(moment: _dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def model_info(snap: Snapshot, ids: FileIds, blobs: bool) -> dict[str, Any]:
    files = list(snap.files())
    by_name = dict(files)
    config = _read_json(by_name.get("config.json"))
    card = _card_metadata(by_name.get("README.md"))
    pipeline = card.get("pipeline_tag") or _pipeline_tag(config)
    library = card.get("library_name") or ("transformers" if config else None)
    model_type = config.get("model_type")

    # Counting parameters reads only the safetensors headers, never the
    # weights, so it is reported whether or not the weights are served.
    weights = [real for rel, real in snap.files(include_weights=True)]
    safetensors = _safetensors_parameters(
        [p for p in weights if p.name.endswith(".safetensors")]
    )

    tags = list(card.get("tags") or [])
    for tag in (
        library,
        "safetensors" if safetensors else None,
        model_type,
        pipeline,
    ):
        if isinstance(tag, str) and tag and tag not in tags:
            tags.append(tag)

    siblings = []
    for rel, real in files:
        sibling: dict[str, Any] = {"rfilename": rel}
        if blobs:
            described = ids.describe(rel, real)
            sibling["size"] = described["size"]
            sibling["blobId"] = described["oid"]
            if described["lfs"]:
                lfs = described["lfs"]
                sibling["lfs"] = {
                    "size": lfs["size"],
                    "sha256": lfs["oid"],
                    "pointerSize": lfs["pointerSize"],
                }
        siblings.append(sibling)

    modified = _iso(snap.last_modified())
    namespace = snap.repo_id.split("/")[0] if "/" in snap.repo_id else None
    info: dict[str, Any] = {
        "_id": hashlib.sha1(snap.repo_id.encode()).hexdigest()[:24],
        "id": snap.repo_id,
        "modelId": snap.repo_id,
        "author": namespace,
        "sha": snap.sha,
        "lastModified": modified,
        "createdAt": modified,
        "private": False,
        "gated": False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": tags,
        "pipeline_tag": pipeline,
        "library_name": library,
        "siblings": siblings,
        "spaces": [],
        "usedStorage": sum(real.stat().st_size for _, real in files),
    }
    if config:
        summary: dict[str, Any] = {}
        for key in ("architectures", "model_type"):
            if key in config:
                summary[key] = config[key]
        tokenizer_config = _read_json(by_name.get("tokenizer_config.json"))
        special = {
            key: value
            for key, value in tokenizer_config.items()
            if key.endswith("_token") and isinstance(value, str)
        }
        if special:
            summary["tokenizer_config"] = special
        info["config"] = summary
        auto = _PIPELINE_AUTO.get(pipeline or "")
        if auto:
            info["transformersInfo"] = {
                "auto_model": auto,
                "pipeline_tag": pipeline,
                "processor": "AutoTokenizer" if tokenizer_config else None,
            }
    if safetensors:
        info["safetensors"] = safetensors
    return info


def tree(snap: Snapshot, ids: FileIds, path: str, recursive: bool, expand: bool) -> list[dict[str, Any]]:
    """The Hub's tree listing of folder ``path`` ("" = the root)."""
    if path:
        parts = split_relative(path)
        if parts is None:
            return []
        prefix = "/".join(parts) + "/"
    else:
        prefix = ""
    entries: list[dict[str, Any]] = []
    folders: dict[str, list[str]] = {}
    for rel, real in snap.files():
        if not rel.startswith(prefix):
            continue
        rest = rel[len(prefix) :].split("/")
        # Every folder between the listed one and the file.
        for depth in range(1, len(rest)):
            folder = prefix + "/".join(rest[:depth])
            if depth == 1 or recursive:
                folders.setdefault(folder, []).append(rel)
        if len(rest) > 1 and not recursive:
            continue
        described = ids.describe(rel, real)
        entry: dict[str, Any] = {
            "type": "file",
            "oid": described["oid"],
            "size": described["size"],
            "path": rel,
        }
        if described["lfs"]:
            entry["lfs"] = dict(described["lfs"])
        entries.append(entry)
    for folder, members in folders.items():
        oid = hashlib.sha1(("\0".join(sorted(members))).encode()).hexdigest()
        entries.append({"type": "directory", "oid": oid, "size": 0, "path": folder})
    if expand:
        commit = {"id": snap.sha, "title": "Hosted by nnhost", "date": _iso(snap.last_modified())}
        for entry in entries:
            entry["lastCommit"] = commit
    entries.sort(key=lambda e: (e["type"] != "directory", e["path"]))
    return entries

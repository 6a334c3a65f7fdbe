"""Building a small LoRA adapter offline, for a model built by `tiny`.

A per-request adapter (``TransformersModel(repo, peft=ADAPTER)``) is applied
by the server for one job; to prove that (adapted differs from base, the next
job sees the base) the tests need an adapter that changes the model. peft
starts ``lora_B`` at zero, which is the identity, so the adapter's weights
are drawn at random from a seed instead. It is saved with peft's own
``save_pretrained`` (``adapter_config.json``, ``adapter_model.safetensors``)
and installed into the Hugging Face cache layout (`hfcache`) under our own
Hub-style id, naming the base model's id as its base.

Deterministic for a given seed. Nothing here loads from the cache or downloads.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from .hfcache import install_snapshot


def build_tiny_lora(
    repo_id: str,
    base_snapshot: os.PathLike[str],
    base_repo_id: str,
    hf_home: Optional[os.PathLike[str]] = None,
    *,
    target_modules: Sequence[str] = ("c_attn", "c_fc"),
    rank: int = 4,
    seed: int = 0,
) -> Path:
    """A random LoRA for the model at ``base_snapshot``, installed as ``repo_id``; the snapshot."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_snapshot))
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(target_modules), lora_dropout=0.0,
        fan_in_fan_out=True,  # GPT-2's Conv1D layers hold their weights transposed
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, safe_serialization=True)
        _name_base(Path(folder), base_repo_id)
        return install_snapshot(Path(folder), repo_id, hf_home)


def _name_base(folder: Path, base_repo_id: str) -> None:
    """The adapter's config names its base by Hub id, not by the folder it was built from."""
    import json

    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = base_repo_id
    path.write_text(json.dumps(config, indent=2, sort_keys=True))

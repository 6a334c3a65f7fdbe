"""Building a small LLaVA-style vision-language model offline.

Vision-language models reach the server with the ``image-text-to-text``
pipeline: a processor (an image processor beside the tokenizer) that the
client's meta model is built from, and requests that carry the user's images.
The tests need such a model with no download, so this builds one: a CLIP
vision tower and a Llama language model of a couple of small layers each,
joined by LLaVA's projector, a BPE tokenizer (`tiny.train_tokenizer`) with an
``<image>`` token, a CLIP image processor for 16x16 pixel inputs, seeded
random weights, installed into the Hugging Face cache layout (`hfcache`)
under our own Hub-style id.

Deterministic for a given seed. Nothing here loads from the cache or downloads.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence, cast

from .hfcache import install_snapshot
from .tiny import DEFAULT_CORPUS, train_tokenizer

IMAGE_TOKEN = "<image>"
#: Pixels per side of the images the processor makes, and of a patch of the tower.
IMAGE_SIZE = 16
PATCH_SIZE = 8


def build_tiny_llava(
    repo_id: str,
    hf_home: Optional[os.PathLike[str]] = None,
    *,
    seed: int = 0,
    corpus: Sequence[str] = DEFAULT_CORPUS,
) -> Path:
    """A random LLaVA (CLIP tower, Llama language model) under ``repo_id``; the snapshot."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = train_tokenizer(corpus, 384)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.pad_token = tokenizer.eos_token
    image_token = cast(int, tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))  # one token: one id
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=image_token,
        vision_feature_layer=-1, vision_feature_select_strategy="default",
    )
    torch.manual_seed(seed)
    model: Any = LlavaForConditionalGeneration(config)
    model.eval()
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    )
    processor = LlavaProcessor(  # type: ignore[no-untyped-call]
        image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default", image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    )
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, safe_serialization=True)
        processor.save_pretrained(folder)
        return install_snapshot(Path(folder), repo_id, hf_home)

"""Building a small Stable-Diffusion-style diffusers pipeline offline.

nnsight's ``DiffusionModel`` wraps a whole diffusers pipeline: several weight
holding components (a UNet, a VAE, a text encoder) beside light ones (a
scheduler, a tokenizer), described by the repo's ``model_index.json`` and one
folder per component. The client builds its meta pipeline from those configs,
the server loads the real one, and a program steers the denoising loop. The
tests need such a pipeline with no download, so this builds one: components of
a few small layers, a BPE tokenizer (`tiny.train_tokenizer`), seeded random
weights, saved with the pipeline's own ``save_pretrained`` and installed into
the Hugging Face cache layout (`hfcache`) under our own Hub-style id.

Deterministic for a given seed. Nothing here loads from the cache or downloads.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

from .hfcache import install_snapshot
from .tiny import DEFAULT_CORPUS, train_tokenizer

#: Pixels per side of the images the pipeline makes (the VAE halves it once).
IMAGE_SIZE = 16


def build_tiny_stable_diffusion(
    repo_id: str,
    hf_home: Optional[os.PathLike[str]] = None,
    *,
    seed: int = 0,
    corpus: Sequence[str] = DEFAULT_CORPUS,
) -> Path:
    """A random text-to-image pipeline (UNet, VAE, CLIP text encoder, DDIM) as ``repo_id``."""
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = train_tokenizer(corpus, 256)
    tokenizer.model_max_length = 16
    tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ))
    unet = UNet2DConditionModel(  # type: ignore[no-untyped-call]
        sample_size=IMAGE_SIZE // 2, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
        attention_head_dim=2, norm_num_groups=4,
    )
    vae = AutoencoderKL(  # type: ignore[no-untyped-call]
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), layers_per_block=1,
        norm_num_groups=4, sample_size=IMAGE_SIZE,
    )
    scheduler = DDIMScheduler(  # type: ignore[no-untyped-call]
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
        set_alpha_to_one=False, steps_offset=1,
    )
    # mypy reads diffusers' top-level name as the placeholder class it exports when torch
    # is missing, which has no save_pretrained: the pipeline is left untyped.
    pipeline: Any = StableDiffusionPipeline(  # type: ignore[no-untyped-call]
        vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=scheduler,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    with tempfile.TemporaryDirectory() as folder:
        pipeline.save_pretrained(folder, safe_serialization=True)
        return install_snapshot(Path(folder), repo_id, hf_home)

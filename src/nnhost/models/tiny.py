"""Building small GPT-2-shaped models offline, for tests and the demo.

No model can be downloaded on an offline machine, yet the server must load
models through the real Hugging Face loading code. So we make them: a GPT-2
config with a few small layers, a byte-level BPE tokenizer trained with the
`tokenizers` library on a handful of sentences, weights from a seeded random
initialisation, saved with `save_pretrained` and installed into the HF cache
layout under a Hub-style id (see `hfcache`).

Everything here is deterministic for a given seed and corpus: building twice
gives the same files, hence the same commit id.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, cast

from .hfcache import install_snapshot

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: A few sentences of plain English: enough for a BPE tokenizer whose merges
#: cover the words the tests and examples use.
DEFAULT_CORPUS: tuple[str, ...] = (
    "The Eiffel Tower is in the city of Paris.",
    "The Colosseum is in the city of Rome.",
    "Hello world, this is a small model for testing.",
    "The quick brown fox jumps over the lazy dog.",
    "Madison Square Garden is located in New York.",
    "Interpretability research looks inside neural networks.",
)


@dataclass(frozen=True)
class TinyGPT2Spec:
    """The shape of a small GPT-2: a few MB of float32 weights by default."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_positions: int = 128
    vocab_size: int = 512
    seed: int = 0


def train_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style) trained on ``corpus``.

    Returns a `transformers` fast tokenizer with GPT-2's special token, ready
    for `save_pretrained`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=1024,
    )


def build_gpt2(
    spec: TinyGPT2Spec,
    corpus: Sequence[str] = DEFAULT_CORPUS,
    *,
    config_overrides: Optional[Mapping[str, Any]] = None,
) -> tuple[Any, PreTrainedTokenizerFast]:
    """A randomly initialised GPT-2 LM and its tokenizer (in memory).

    ``config_overrides`` are extra `GPT2Config` fields (e.g. dropout rates for a
    model that is going to be trained); by default GPT-2's own defaults apply.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = train_tokenizer(corpus, spec.vocab_size)
    eos = cast(int, tokenizer.convert_tokens_to_ids("<|endoftext|>"))  # one token: one id
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=spec.n_positions,
        n_embd=spec.n_embd,
        n_layer=spec.n_layer,
        n_head=spec.n_head,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        **dict(config_overrides or {}),
    )
    torch.manual_seed(spec.seed)
    model: Any = GPT2LMHeadModel(config)  # type: ignore[no-untyped-call]
    model.eval()
    return model, tokenizer


def save_to_cache(
    model: Any,
    tokenizer: Any,
    repo_id: str,
    hf_home: Optional[os.PathLike[str]] = None,
    *,
    extra_files: Optional[Mapping[str, str]] = None,
) -> Path:
    """`save_pretrained` both into the HF cache as ``repo_id``; returns the snapshot.

    ``extra_files`` maps file names to text written next to them (a marker such
    as the demo model's recipe); they are part of the snapshot, so of its commit id.
    """
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        for name, text in (extra_files or {}).items():
            Path(folder, name).write_text(text, encoding="utf-8")
        return install_snapshot(Path(folder), repo_id, hf_home)


def build_tiny_gpt2(
    repo_id: str,
    hf_home: Optional[os.PathLike[str]] = None,
    spec: TinyGPT2Spec = TinyGPT2Spec(),
    corpus: Sequence[str] = DEFAULT_CORPUS,
) -> Path:
    """Build a random small GPT-2 and install it under ``repo_id``; returns the snapshot."""
    model, tokenizer = build_gpt2(spec, corpus)
    return save_to_cache(model, tokenizer, repo_id, hf_home)

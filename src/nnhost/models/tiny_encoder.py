"""Building small BERT-style encoders offline: for fill-mask and the classification tasks.

Encoders reach the server through other pipelines than text generation
(``fill-mask``, ``text-classification``), with their own tokenizer (WordPiece
with [CLS]/[SEP]/[MASK]) and model heads; a server that only ever saw GPT-2
would not notice if either broke. These builders give the tests such models
with no download: a WordPiece tokenizer trained on a few sentences, a BERT
config with two small layers, seeded random weights, installed into the
Hugging Face cache layout (`hfcache`) under our own Hub-style ids.

Deterministic for a given seed: building twice gives the same commit id.
Nothing here loads a model from the cache or downloads anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .tiny import DEFAULT_CORPUS, save_to_cache

if TYPE_CHECKING:
    from transformers import BertConfig, PreTrainedTokenizerFast

#: The classifier's labels, written into its config (the pipeline reports them by name).
LABELS = ("NEGATIVE", "POSITIVE")
_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def train_wordpiece(corpus: Sequence[str], vocab_size: int = 256) -> PreTrainedTokenizerFast:
    """A BERT-style (WordPiece, lower-cased) fast tokenizer trained on ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(_SPECIALS), show_progress=False
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=128,
    )


def _config(tokenizer: PreTrainedTokenizerFast, **extra: Any) -> BertConfig:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def build_tiny_bert(
    repo_id: str,
    hf_home: Optional[os.PathLike[str]] = None,
    *,
    head: str = "masked-lm",
    seed: int = 0,
    corpus: Sequence[str] = DEFAULT_CORPUS,
) -> Path:
    """A random two-layer BERT under ``repo_id``; the snapshot folder.

    ``head``: ``"masked-lm"`` (fill-mask), ``"sequence"`` (text-classification)
    or ``"token"`` (token-classification), the classifiers with two labels.
    """
    import torch
    from transformers import BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification

    heads = {"masked-lm": BertForMaskedLM, "sequence": BertForSequenceClassification,
             "token": BertForTokenClassification}
    tokenizer = train_wordpiece(corpus)
    torch.manual_seed(seed)
    if head == "masked-lm":
        config = _config(tokenizer)
    else:
        config = _config(
            tokenizer,
            id2label=dict(enumerate(LABELS)),
            label2id={label: index for index, label in enumerate(LABELS)},
        )
    model: Any = heads[head](config)  # type: ignore[no-untyped-call]
    model.eval()
    return save_to_cache(model, tokenizer, repo_id, hf_home)

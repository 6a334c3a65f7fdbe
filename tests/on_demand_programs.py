"""The program the on-demand tests run, through the server and locally (same code both sides)."""

from __future__ import annotations

PROMPT = "The quick brown fox jumps over the lazy dog"


def read_and_patch(model, remote):
    """Read a block's output and the logits, and zero one MLP's output."""
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].output[0].save()
        model.transformer.h[1].mlp.output[:] = 0
        logits = model.lm_head.output.save()
    return {"hidden": hidden, "logits": logits}

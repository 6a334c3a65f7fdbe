"""What the latency benchmarks share: the prompt, the client's two models, one timed remote trace.

Each benchmark compares a server's answer with the same trace run here on
the same weights before it times anything, so a fast wrong answer never
counts. Run the benchmarks as scripts from this folder (they import this
module by name, as they import `hotswap`).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

PROMPT = "The Eiffel Tower is in the city of"


def client_models(repo_id: str, snapshot: Path) -> tuple[Any, Any, Any]:
    """The client's remote model, the same weights loaded here, and their last-position logits here."""
    import nnsight
    from nnsight import LanguageModel

    nnsight.CONFIG.APP.REMOTE_LOGGING = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        remote = LanguageModel(repo_id)
        local = LanguageModel(str(snapshot), dispatch=True)
    with local.trace(PROMPT):
        expected = local.lm_head.output[:, -1].save()
    return remote, local, expected


def timed_trace(model: Any, url: str) -> tuple[float, Any, dict[str, Any]]:
    """One remote trace of the last-position logits: seconds on the client's clock, the logits, the job's meta."""
    from nnsight.intervention.backends.remote import RemoteBackend

    backend = RemoteBackend(model.to_model_key(), host=url)
    started = time.perf_counter()
    with model.trace(PROMPT, backend=backend):
        logits = model.lm_head.output[:, -1].save()
    return time.perf_counter() - started, logits, backend.meta or {}

"""Does the per-job guard grow with the weights? Two models ten times apart in size.

Run it as::

    .venv/bin/python benchmarks/guard.py [--repeats N] [--device cpu|cuda:0]

It builds two random GPT-2-shaped models in the HF cache layout under a temp
dir (about 3M and 30M parameters; nothing is downloaded), loads each with
nnsight as a worker does, and times `ModelGuard.restore` (what runs after
every job, before its result goes out) after a real small trace, in both of
the guard's ways of keeping weights:

* ``read-only image``: CPU weights in a sealed read-only mapping (the default
  on the CPU; nothing about the weights is checked per job);
* ``seal``: per parameter, its version counter and pointers (what runs for
  weights on an accelerator; forced here on the CPU with
  ``read_only_weights=False``).

It also prints the full fingerprint (`ModelGuard.verify_weights`), which reads
every weight and so grows with them: it runs off the request path. Figures are
medians in milliseconds; the last line is the per-job ratio large/small, which
stays near 1 while the weights grow tenfold.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

SIZES = {
    "small": dict(n_layer=4, n_embd=256, n_head=4),
    # The same depth, so the same number of tensors: only their size grows.
    "large": dict(n_layer=4, n_embd=832, n_head=8),
}
PROMPT = "The Eiffel Tower is in the city of"


def build(name: str, shape: dict, hf_home: Path) -> Path:
    from nnhost.models.tiny import TinyGPT2Spec, build_tiny_gpt2

    return build_tiny_gpt2(f"nnhost-bench/guard-{name}", hf_home, TinyGPT2Spec(**shape, vocab_size=512))


def load(snapshot: Path, device: str):
    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LanguageModel(str(snapshot), dispatch=True)
    for parameter in model._module.parameters():
        parameter.requires_grad_(False)
    model._module.to(device)
    return model


def median_ms(values: list) -> float:
    return statistics.median(values) * 1000


def measure(model, read_only: bool, repeats: int) -> tuple[float, float]:
    from nnhost.execution.guard.integrity import ModelGuard

    guard = ModelGuard(model, model._remoteable_persistent_objects(), read_only_weights=read_only)
    per_job, full = [], []
    for _ in range(repeats):
        with model.trace(PROMPT):
            logits = model.lm_head.output.save()
        started = time.perf_counter()
        report = guard.restore()
        per_job.append(time.perf_counter() - started)
        assert not report.fatal, report.fatal
        started = time.perf_counter()
        changed = guard.verify_weights(force=True)
        full.append(time.perf_counter() - started)
        assert not changed, changed
    return median_ms(per_job), median_ms(full)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    results = {}
    with tempfile.TemporaryDirectory(prefix="nnhost-guard-") as folder:
        for name, shape in SIZES.items():
            model = load(build(name, shape, Path(folder)), args.device)
            parameters = sum(p.numel() for p in model._module.parameters())
            ways = [("seal", False)] + ([("read-only image", True)] if args.device == "cpu" else [])
            for way, read_only in ways:
                per_job, full = measure(model, read_only, args.repeats)
                results[(name, way)] = per_job
                print(
                    f"{name:6s} {parameters / 1e6:6.1f}M parameters on {args.device}, {way:15s}: "
                    f"per-job guard {per_job:7.2f} ms   full fingerprint {full:8.2f} ms"
                    + ("" if read_only is False else " (none needed: read-only)"),
                    flush=True,
                )
            del model
    for way in ("seal", "read-only image"):
        if ("large", way) in results:
            ratio = results[("large", way)] / results[("small", way)]
            print(f"per-job guard, large/small ({way}): {ratio:.2f}x for 10x the weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())

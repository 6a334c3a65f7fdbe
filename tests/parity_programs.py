"""nnsight programs as data: each runs remotely and locally and must give the same saves.

``PROGRAMS`` is a list of ``(name, function)``; ``function(model, remote)``
runs one program against ``model`` (``remote`` is passed to nnsight as is:
False for a local run, True or a server URL for a remote one) and returns a
dict of what it saved. `tests/test_parity.py` and `benchmarks/gpu_check.py`
both read this list, so a program may only use what the client side of both
has: torch, numpy, einops, sympy and nnsight.

The programs are ordinary interpretability code, chosen so that together
they reach the lazily imported corners of the allowed libraries (numpy's
statistics, linalg and fft; torch.linalg, quantile and distributions; einops;
sympy), code shipped by value that calls them, sessions, generation, gradients
and batched invokes, and so that saved values of every kind come back: model
output classes, ``torch.Size``, tuples, named tuples, lists, dicts, numpy
arrays and scalars, Python numbers and strings, nested.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

PROMPT = "The Eiffel Tower is in the city of"
OTHER = "The Colosseum is in the city of"

PROGRAMS: list = []


def program(function):
    PROGRAMS.append((function.__name__, function))
    return function


# --- whole outputs and their types -------------------------------------------------


@program
def model_output(model, remote):
    with model.trace(PROMPT, remote=remote):
        output = model.output.save()
    return {"output": output}


@program
def block_output(model, remote):
    with model.trace(PROMPT, remote=remote):
        block = model.transformer.h[0].output.save()
        attn = model.transformer.h[1].attn.output.save()
    return {"block": block, "attn": attn}


@program
def lm_head_logits(model, remote):
    with model.trace(PROMPT, remote=remote):
        logits = model.lm_head.output.save()
    return {"logits": logits}


@program
def module_inputs(model, remote):
    with model.trace(PROMPT, remote=remote):
        mlp_input = model.transformer.h[0].mlp.input.save()
        inputs = model.transformer.h[1].mlp.inputs.save()
    return {"mlp_input": mlp_input, "inputs": inputs}


@program
def shapes(model, remote):
    with model.trace(PROMPT, remote=remote):
        size = model.transformer.h[0].mlp.output.size().save()
        shape = model.lm_head.output.shape.save()
        dims = model.lm_head.output.dim().save()
    return {"shape": shape, "size": size, "dims": dims}


@program
def tuple_of_tensors(model, remote):
    with model.trace(PROMPT, remote=remote):
        pair = (model.transformer.h[0].mlp.output, model.transformer.h[1].mlp.output).save()
    return {"pair": pair}


@program
def dict_of_tensors(model, remote):
    with model.trace(PROMPT, remote=remote):
        layers = {f"layer{i}": model.transformer.h[i].mlp.output[0, -1] for i in range(2)}
        layers = layers.save()
    return {"layers": layers}


@program
def nested_containers(model, remote):
    with model.trace(PROMPT, remote=remote):
        logits = model.lm_head.output
        nested = {
            "top": (logits[0, -1].topk(3).indices, [logits.shape, "text", 3, 2.5, None]),
            "list": [logits[0, 0, :2], {"inner": (True, logits.dtype)}],
        }.save()
    return {"nested": nested}


@program
def named_tuple_topk(model, remote):
    with model.trace(PROMPT, remote=remote):
        top = model.lm_head.output[0, -1].topk(5).save()
        best = model.lm_head.output[0].max(dim=-1).save()
    return {"top": top, "best": best}


@program
def python_numbers(model, remote):
    with model.trace(PROMPT, remote=remote):
        logits = model.lm_head.output
        token = logits[0, -1].argmax().item().save()
        mean = logits.mean().item().save()
        text = str(logits.shape[-1]).save()
        flag = bool(logits.shape[0] == 1).save()
        values = logits[0, -1, :4].tolist().save()
    return {"token": token, "mean": mean, "text": text, "flag": flag, "values": values}


# --- numpy -------------------------------------------------------------------------


@program
def numpy_mean_axis(model, remote):
    import numpy as np

    with model.trace(PROMPT, remote=remote):
        means = np.asarray(model.transformer.h[0].mlp.output[0].numpy()).mean(axis=-1).save()
    return {"means": means}


@program
def numpy_statistics(model, remote):
    import numpy as np

    with model.trace(PROMPT, remote=remote):
        h = model.transformer.h[0].mlp.output[0].numpy()
        stats = {
            "p90": np.percentile(h, 90),
            "median": np.median(h),
            "std": np.std(h),
            "var": h.var(axis=0),
            "quantiles": np.quantile(h, [0.1, 0.5, 0.9]),
        }.save()
    return {"stats": stats}


@program
def numpy_linalg(model, remote):
    import numpy as np

    with model.trace(PROMPT, remote=remote):
        h = model.transformer.h[1].mlp.output[0].numpy().astype(np.float64)
        norm = np.linalg.norm(h, axis=-1).save()
        singular = np.linalg.svd(h, compute_uv=False).save()
        rank = int(np.linalg.matrix_rank(h)).save()
        gram_det = float(np.linalg.det(h @ h.T + np.eye(h.shape[0]))).save()
    return {"norm": norm, "singular": singular, "rank": rank, "gram_det": gram_det}


@program
def numpy_fft(model, remote):
    import numpy as np

    with model.trace(PROMPT, remote=remote):
        h = model.transformer.h[0].mlp.output[0, -1].numpy()
        spectrum = np.abs(np.fft.rfft(h)).save()
        peak = np.argmax(spectrum[1:]).save()
    return {"spectrum": spectrum, "peak": peak}


@program
def numpy_scalars_and_sorting(model, remote):
    import numpy as np

    with model.trace(PROMPT, remote=remote):
        h = model.lm_head.output[0, -1].numpy()
        order = np.argsort(h)[-5:].save()
        biggest = h.max().save()
        histogram = np.histogram(h, bins=5)[0].save()
        corr = np.corrcoef(h[:8], h[8:16]).save()
    return {"order": order, "biggest": biggest, "histogram": histogram, "corr": corr}


# --- torch's own libraries ----------------------------------------------------------


@program
def torch_linalg(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        h = model.transformer.h[0].mlp.output[0].double()
        norms = torch.linalg.vector_norm(h, dim=-1).save()
        singular = torch.linalg.svdvals(h).save()
        q, r = torch.linalg.qr(h.T)
        r_diag = r.diagonal().abs().save()
    return {"norms": norms, "singular": singular, "r_diag": r_diag}


@program
def torch_quantile(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        h = model.lm_head.output[0, -1]
        quantiles = torch.quantile(h, torch.tensor([0.25, 0.5, 0.75])).save()
        median = h.median().save()
        kth = h.kthvalue(3).save()
    return {"quantiles": quantiles, "median": median, "kth": kth}


@program
def torch_distributions(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        logits = model.lm_head.output[0, -1]
        dist = torch.distributions.Categorical(logits=logits)
        entropy = dist.entropy().save()
        log_prob = dist.log_prob(torch.tensor(3)).save()
        normal = torch.distributions.Normal(logits.mean(), logits.std())
        cdf = normal.cdf(logits[:5]).save()
    return {"entropy": entropy, "log_prob": log_prob, "cdf": cdf}


@program
def torch_fft_and_special(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        h = model.transformer.h[0].mlp.output[0, -1]
        spectrum = torch.fft.rfft(h).abs().save()
        erf = torch.special.erf(h[:6]).save()
    return {"spectrum": spectrum, "erf": erf}


@program
def softmax_probabilities(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        probs = torch.nn.functional.softmax(model.lm_head.output[0, -1], dim=-1)
        top = probs.topk(3).save()
        total = probs.sum().save()
    return {"top": top, "total": total}


@program
def cosine_similarity_between_layers(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        a = model.transformer.h[0].mlp.output[0]
        b = model.transformer.h[1].mlp.output[0]
        similarity = torch.nn.functional.cosine_similarity(a, b, dim=-1).save()
    return {"similarity": similarity}


# --- einops and sympy -------------------------------------------------------------


@program
def einops_rearrange(model, remote):
    import einops

    with model.trace(PROMPT, remote=remote):
        h = model.transformer.h[0].mlp.output
        heads = einops.rearrange(h, "b s (n d) -> b n s d", n=2).save()
    return {"heads": heads}


@program
def einops_reduce_repeat(model, remote):
    import einops

    with model.trace(PROMPT, remote=remote):
        h = model.transformer.h[1].mlp.output
        pooled = einops.reduce(h, "b s d -> b d", "mean").save()
        tiled = einops.repeat(pooled, "b d -> b k d", k=2).save()
        mixed = einops.einsum(h, h, "b s d, b t d -> b s t").save()
    return {"pooled": pooled, "tiled": tiled, "mixed": mixed}


@program
def sympy_on_numbers(model, remote):
    import sympy

    with model.trace(PROMPT, remote=remote):
        count = model.lm_head.output.shape[-1]
        factors = {int(k): int(v) for k, v in sympy.factorint(count).items()}.save()
        prime = bool(sympy.isprime(count)).save()
        x = sympy.Symbol("x")
        root = float(sympy.nsolve(x**2 - count, x, 10)).save()
    return {"factors": factors, "prime": prime, "root": root}


@program
def sympy_rational(model, remote):
    import sympy

    with model.trace(PROMPT, remote=remote):
        n = model.lm_head.output.shape[1]
        fraction = str(sympy.Rational(n, 12)).save()
        series = str(sympy.summation(sympy.Symbol("k") ** 2, (sympy.Symbol("k"), 1, n))).save()
    return {"fraction": fraction, "series": series}


@program
def math_and_collections(model, remote):
    import collections
    import math

    with model.trace(PROMPT, remote=remote):
        tokens = model.lm_head.output[0].argmax(dim=-1).tolist()
        counts = dict(collections.Counter(tokens)).save()
        log = math.log(len(tokens)).save()
    return {"counts": counts, "log": log}


# --- code shipped by value ------------------------------------------------------------

_HELPERS = '''
import einops
import numpy as np
import sympy
import torch


def stats(hidden):
    values = hidden.detach().numpy()
    return {"median": np.median(values), "p75": np.percentile(values, 75),
            "norm": np.linalg.norm(values), "fft": np.abs(np.fft.fft(values[0, -1]))[:4]}


def heads(hidden, n=2):
    return einops.rearrange(hidden, "b s (n d) -> b n s d", n=n)


def spread(hidden):
    return torch.quantile(hidden.flatten().float(), 0.9), torch.linalg.matrix_norm(hidden[0])


def entropy(logits):
    return torch.distributions.Categorical(logits=logits).entropy()


def divisors(n):
    return [int(d) for d in sympy.divisors(int(n))]
'''


def _helpers():
    """The helper module, written to a folder the server has never seen, and registered."""
    name = "nnhost_parity_helpers"
    if name not in sys.modules:
        folder = Path(tempfile.mkdtemp(prefix="nnhost-parity-"))
        (folder / f"{name}.py").write_text(_HELPERS)
        sys.path.insert(0, str(folder))
        try:
            module = importlib.import_module(name)
        finally:
            sys.path.remove(str(folder))
        import nnsight

        nnsight.register(module)
    return sys.modules[name]


@program
def shipped_numpy_helpers(model, remote):
    helpers = _helpers()
    with model.trace(PROMPT, remote=remote):
        stats = helpers.stats(model.transformer.h[0].mlp.output).save()
    return {"stats": stats}


@program
def shipped_einops_and_torch(model, remote):
    helpers = _helpers()
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[1].mlp.output
        heads = helpers.heads(hidden).save()
        spread = helpers.spread(hidden).save()
        entropy = helpers.entropy(model.lm_head.output[0, -1]).save()
    return {"heads": heads, "spread": spread, "entropy": entropy}


@program
def shipped_sympy(model, remote):
    helpers = _helpers()
    with model.trace(PROMPT, remote=remote):
        divisors = helpers.divisors(model.lm_head.output.shape[-1]).save()
    return {"divisors": divisors}


@program
def shipped_local_function(model, remote):
    import numpy as np

    def summarise(hidden):
        values = hidden.numpy()
        return np.median(values, axis=-1), float(np.std(values))

    with model.trace(PROMPT, remote=remote):
        summary = summarise(model.transformer.h[0].mlp.output[0]).save()
    return {"summary": summary}


# --- interventions, invokes, sessions --------------------------------------------------


@program
def zero_a_position(model, remote):
    with model.trace(PROMPT, remote=remote):
        model.transformer.h[0].output[:, -1, :] = 0
        logits = model.lm_head.output.save()
    return {"logits": logits}


@program
def scale_the_mlp(model, remote):
    with model.trace(PROMPT, remote=remote):
        model.transformer.h[0].mlp.output = model.transformer.h[0].mlp.output * 2
        logits = model.lm_head.output[:, -1].save()
    return {"logits": logits}


@program
def steering_vector(model, remote):
    import torch

    with model.trace(PROMPT, remote=remote):
        mlp = model.transformer.h[0].mlp.output
        model.transformer.h[0].mlp.output = mlp + torch.ones(mlp.shape[-1])
        norms = model.transformer.h[-1].mlp.output.norm(dim=-1).save()
    return {"norms": norms}


@program
def batched_invokes(model, remote):
    with model.trace(remote=remote) as tracer:
        with tracer.invoke(PROMPT):
            first = model.lm_head.output[:, -1].save()
        with tracer.invoke(OTHER):
            second = model.lm_head.output[:, -1].save()
        with tracer.invoke():
            everything = model.lm_head.output.save()
    return {"first": first, "second": second, "everything": everything}


@program
def batch_of_prompts(model, remote):
    with model.trace([PROMPT, OTHER], remote=remote):
        logits = model.lm_head.output[:, -1].save()
        output = model.output.save()
    return {"logits": logits, "output": output}


@program
def patch_between_invokes(model, remote):
    with model.trace(OTHER, remote=remote):
        model.transformer.h[1].mlp.output[:, -1] = model.transformer.h[0].mlp.output[:, -1]
        patched = model.lm_head.output[:, -1].save()
    return {"patched": patched}


@program
def session_patch(model, remote):
    with model.session(remote=remote):
        with model.trace(PROMPT):
            eiffel = model.transformer.h[-1].mlp.output[:, -1, :]
        with model.trace(OTHER):
            model.transformer.h[-1].mlp.output[:, -1, :] = eiffel
            patched = model.lm_head.output.save()
    return {"patched": patched}


@program
def session_with_numpy(model, remote):
    import numpy as np

    with model.session(remote=remote):
        with model.trace(PROMPT):
            a = model.transformer.h[0].mlp.output[0, -1].numpy()
        with model.trace(OTHER):
            b = model.transformer.h[0].mlp.output[0, -1].numpy()
            distance = np.linalg.norm(a - b, axis=-1).save()
            shape = model.output.logits.shape.save()
    return {"distance": distance, "shape": shape}


@program
def print_inside_a_trace(model, remote):
    with model.trace(PROMPT, remote=remote):
        print("logits", model.lm_head.output.shape)
        logits = model.lm_head.output[0, -1, :3].save()
    return {"logits": logits}


# --- gradients ---------------------------------------------------------------------


@program
def gradient_of_activation(model, remote):
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].mlp.output
        hidden.requires_grad = True
        loss = model.lm_head.output[0, -1, 5]
        with loss.backward():
            grad = hidden.grad.save()
    return {"grad": grad}


@program
def gradient_norms(model, remote):
    with model.trace(PROMPT, remote=remote):
        first = model.transformer.h[0].mlp.output
        first.requires_grad = True
        loss = model.lm_head.output[0, -1].logsumexp(dim=-1)
        with loss.backward():
            grad = first.grad
            norms = grad.norm(dim=-1).save()
            largest = grad.abs().max().item().save()
    return {"norms": norms, "largest": largest}


# --- generation --------------------------------------------------------------------


@program
def generate_result(model, remote):
    with model.generate(PROMPT, max_new_tokens=3, remote=remote) as tracer:
        output = tracer.result.save()
    return {"output": output}


@program
def generate_iter_tokens(model, remote):
    with model.generate(OTHER, max_new_tokens=3, remote=remote) as tracer:
        tokens = list().save()
        for step in tracer.iter[:]:
            tokens.append(model.lm_head.output[0, -1].argmax(dim=-1))
    return {"tokens": tokens}


@program
def generate_iter_shapes(model, remote):
    with model.generate(PROMPT, max_new_tokens=3, remote=remote) as tracer:
        shapes = list().save()
        for step in tracer.iter[:]:
            shapes.append(model.transformer.h[0].mlp.output.shape)
    return {"shapes": shapes}


@program
def generate_intervene_each_step(model, remote):
    with model.generate(PROMPT, max_new_tokens=3, remote=remote) as tracer:
        tops = list().save()
        for step in tracer.iter[:]:
            model.transformer.h[0].mlp.output[:, -1] = 0
            tops.append(model.lm_head.output[0, -1].topk(2))
    return {"tops": tops}


@program
def generate_numpy_per_step(model, remote):
    import numpy as np

    with model.generate(PROMPT, max_new_tokens=2, remote=remote) as tracer:
        medians = list().save()
        for step in tracer.iter[:]:
            medians.append(np.median(model.lm_head.output[0, -1].numpy()))
    return {"medians": medians}

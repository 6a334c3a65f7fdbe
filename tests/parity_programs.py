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

The user's own classes (``user_classes``, a module registered by value as a
script's code is) cover what a researcher writes around a trace: static and
class methods and properties, a ``typing.NamedTuple``, dataclasses (frozen,
ordered, with factories and a forward reference), an enum with methods,
annotated helpers, an ``nn.Module`` subclass calling ``super().__init__()``
and instances of these saved as results, which must come back as instances
of the user's own class.
"""

from __future__ import annotations

import atexit
import importlib
import shutil
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
    return shipped_module("nnhost_parity_helpers", _HELPERS)


def shipped_module(name, source):
    """A module of the user's, written to a folder the server has never seen, and registered."""
    if name not in sys.modules:
        folder = Path(tempfile.mkdtemp(prefix="nnhost-parity-"))
        atexit.register(shutil.rmtree, folder, True)  # the source is read until the process ends
        (folder / f"{name}.py").write_text(source)
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


# --- classes from the user's script, shipped by value --------------------------------

_CLASSES = '''
import dataclasses
import enum
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional

import torch


class Scaler:
    """A small class with every kind of method a researcher writes."""

    def __init__(self, factor):
        self.factor = factor

    @staticmethod
    def double(x):
        return x * 2

    @classmethod
    def halving(cls):
        return cls(0.5)

    @property
    def twice(self):
        return self.factor * 2

    def __call__(self, x):
        return x * self.factor


class Summary(NamedTuple):
    mean: torch.Tensor
    top: int
    label: str = "summary"


@dataclass
class Probe:
    layer: int
    scale: float = 1.0
    tags: List[str] = field(default_factory=list)
    parent: Optional["Probe"] = None

    def tagged(self, tag):
        return Probe(self.layer, self.scale, self.tags + [tag], parent=self)


@dataclass(frozen=True, order=True)
class Position:
    index: int
    weight: Optional[float] = None


class Reduction(enum.Enum):
    MEAN = "mean"
    NORM = "norm"

    def apply(self, x):
        return x.mean(dim=-1) if self is Reduction.MEAN else x.norm(dim=-1)


class ProbeError(ValueError):
    """Raised by the user's own code when a layer is out of range."""


def check_width(hidden, limit):
    if hidden.shape[-1] > limit:
        raise ProbeError(f"width {hidden.shape[-1]} is over {limit}")
    return hidden


def last_position(hidden: torch.Tensor, width: Optional[int] = None) -> "torch.Tensor | None":
    """Annotated with typing generics and a union, as researchers write helpers."""
    return hidden[0, -1, :width]


def pick(values: List[int], limit: Optional[int] = None) -> List[int]:
    return values[:limit]


class LinearProbe(torch.nn.Module):
    """A probe module made inside the trace; its weights are fixed so runs agree."""

    def __init__(self, width, classes=2):
        super().__init__()
        self.linear = torch.nn.Linear(width, classes)
        with torch.no_grad():
            self.linear.weight.copy_(torch.linspace(-1, 1, width * classes).reshape(classes, width))
            self.linear.bias.zero_()
        self.__calls = 0

    def forward(self, x):
        self.__calls += 1
        return self.linear(x)

    @property
    def calls(self):
        return self.__calls


class Store:
    """A small container of the user's, saved as a result."""

    def __init__(self):
        self.items = {}

    def add(self, name, value):
        self.items[name] = value
        return self
'''


def user_classes():
    return shipped_module("nnhost_parity_classes", _CLASSES)


@program
def script_class_methods(model, remote):
    user = user_classes()
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].mlp.output[0, -1]
        scaled = user.Scaler(3.0)(hidden).save()
        doubled = user.Scaler.double(hidden[:4]).save()
        half = user.Scaler.halving().factor.save()
        twice = user.Scaler(2.5).twice.save()
    return {"scaled": scaled, "doubled": doubled, "half": half, "twice": twice}


@program
def script_named_tuple_result(model, remote):
    user = user_classes()
    with model.trace(PROMPT, remote=remote):
        logits = model.lm_head.output[0, -1]
        summary = user.Summary(logits.mean(), int(logits.argmax())).save()
        renamed = summary._replace(label="renamed").save()
        fields = user.Summary._fields.save()
    return {"summary": summary, "renamed": renamed, "fields": fields}


@program
def script_dataclass_in_trace(model, remote):
    user = user_classes()
    probe = user.Probe(layer=1)
    with model.trace(PROMPT, remote=remote):
        made = user.Probe(layer=0, scale=2.0).tagged("inside")
        hidden = model.transformer.h[made.layer].mlp.output * made.scale
        norm = hidden.norm().save()
        sent = probe.tagged("sent").save()
        made = made.save()
        ordered = sorted([user.Position(3, 0.5), user.Position(1)]).save()
    return {"norm": norm, "sent": sent, "made": made, "ordered": ordered}


@program
def script_enum(model, remote):
    user = user_classes()
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[1].mlp.output[0]
        mean = user.Reduction.MEAN.apply(hidden).save()
        norm = user.Reduction("norm").apply(hidden).save()
        chosen = user.Reduction.NORM.save()
    return {"mean": mean, "norm": norm, "chosen": chosen}


@program
def script_annotated_helpers(model, remote):
    user = user_classes()
    with model.trace(PROMPT, remote=remote):
        last = user.last_position(model.transformer.h[0].mlp.output, 5).save()
        tokens = user.pick(model.lm_head.output[0].argmax(dim=-1).tolist(), 3).save()
    return {"last": last, "tokens": tokens}


@program
def script_module_subclass(model, remote):
    user = user_classes()
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[-1].mlp.output[0, -1]
        probe = user.LinearProbe(hidden.shape[-1])
        scores = probe(hidden).save()
        again = probe(hidden * 2).save()
        calls = probe.calls.save()
    return {"scores": scores, "again": again, "calls": calls}


@program
def script_instance_result(model, remote):
    user = user_classes()
    with model.trace(PROMPT, remote=remote):
        store = user.Store().add("logit", model.lm_head.output[0, -1, 0])
        store = store.add("shape", model.lm_head.output.shape).save()
        box = [user.Summary(model.lm_head.output.mean(), 1, "nested")].save()
    return {"store": store, "box": box}


@program
def local_class_and_closure(model, remote):
    class Window:
        def __init__(self, width):
            self.width = width

        @staticmethod
        def clip(x):
            return x.clamp(-1, 1)

    offset = 0.25

    def shift(x):
        return x + offset

    with model.trace(PROMPT, remote=remote):
        window = Window(3)
        clipped = Window.clip(shift(model.transformer.h[0].mlp.output[0, -1, : window.width])).save()
    return {"clipped": clipped}


@program
def saved_leaf_gradient(model, remote):
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].mlp.output.save()
        hidden.requires_grad = True
        loss = model.lm_head.output[0, -1, 5]
        with loss.backward():
            pass
    if hidden.grad is None:  # locally the leaf keeps its gradient: so must the result
        raise AssertionError("the saved leaf came back without its .grad")
    return {"grad": hidden.grad, "hidden": hidden}


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

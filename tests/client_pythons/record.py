"""Record requests made by a real nnsight client on another Python, with its local results.

Run by hand, once per client Python, with that Python's own environment
(``python -m venv``, then ``pip install nnsight==0.8.1 torch==2.13.0``),
against a running nnhost server that serves the test model:

    NDIF_API_KEY=... CLIENT/bin/python tests/client_pythons/record.py \\
        --server http://127.0.0.1:PORT --snapshot HF_HOME/.../snapshots/REV \\
        --out tests/data/client_pythons/python-3.12.pt

Each program below runs twice with that client: locally, against the
snapshot's weights, and remotely through the real client against the
server, which this script checks equal (it prints a line per program and
exits non-zero on a difference: that is the real client on that Python,
end to end). The request the client sent (its blob and envelope) and the
local result's description (`describe`) are written to ``--out``;
`tests/test_client_pythons.py` sends each blob again to a fresh server and
compares what comes back with the recorded local result.

The classes here are the user's script's (``__main__``): the client ships
them by value, written the way that client's Python writes them.
"""

from __future__ import annotations

import abc
import argparse
import collections
import dataclasses
import enum
import functools
import os
import sys
import typing
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

sys.path.insert(0, str(Path(__file__).resolve().parent))
from describe import describe, same  # noqa: E402

PROMPT = "The Eiffel Tower is in the city of"
TEST_REPO = "nnhost-test/tiny-gpt2"

# --- the user's script's own classes ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Probe:
    layer: int
    scale: float = 1.0
    tags: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(order=True)
class Reading:
    """A dataclass whose instances come back as results."""

    name: str
    value: float
    note: Optional[str] = None


@dataclasses.dataclass(kw_only=True, slots=True)
class Window:
    start: int
    stop: int = 4

    def width(self) -> int:
        return self.stop - self.start


class Site(enum.Enum):
    MLP = "mlp"
    ATTN = "attn"

    def module(self, model, layer):
        return getattr(model.transformer.h[layer], self.value)


class Span(NamedTuple):
    first: int
    last: int = 3


class Config(typing.TypedDict):
    layer: int
    k: int


class Scaler:
    factor = 2.0

    def __init__(self, offset: float) -> None:
        self._offset = offset

    @property
    def offset(self) -> float:
        return self._offset

    @staticmethod
    def double(x):
        return x * 2

    @classmethod
    def make(cls, offset: float) -> "Scaler":
        return cls(offset)


def top_tokens(logits, k: int = 3) -> Tuple[List[int], Union[float, None]]:
    values, indices = logits.topk(k)
    return indices.tolist(), float(values[0])


def tokens_of(config: Config) -> Dict[str, int]:
    return {"layer": config["layer"], "k": config["k"]}


class Perm(enum.Flag):
    R = 4
    W = 2
    X = 1
    RW = R | W


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


T = typing.TypeVar("T")


class Stack(typing.Generic[T]):
    def __init__(self) -> None:
        self.items: List[T] = []

    def push(self, item: T) -> None:
        self.items.append(item)

    def top(self) -> T:
        return self.items[-1]


class Scorer(abc.ABC):
    @abc.abstractmethod
    def score(self, x): ...


class MaxScorer(Scorer):
    def score(self, x):
        return x.max()


@dataclasses.dataclass
class Scaled:
    base: dataclasses.InitVar[float]
    factor: typing.ClassVar[float] = 2.0
    value: float = 0.0

    def __post_init__(self, base):
        self.value = base * self.factor


@dataclasses.dataclass
class Choice:
    name: str
    _: dataclasses.KW_ONLY
    k: int = 3
    mode: typing.Literal["mean", "max"] = "max"
    weight: typing.Annotated[float, "unit"] = 1.0


# --- the programs: (name, shipped or made here, function) ------------------------------

PROGRAMS: list = []


def program(kind):
    def add(function):
        PROGRAMS.append((function.__name__, kind, function))
        return function
    return add


@program("shipped")
def script_dataclasses(model, **trace):
    probe = Probe(layer=1, scale=0.5, tags=["a"])
    window = Window(start=1)
    with model.trace(PROMPT, **trace):
        hidden = model.transformer.h[probe.layer].output[0][0, window.start:window.stop] * probe.scale
        width = window.width()
        reading = Reading("norm", float(hidden.norm())).save()
        shape = hidden.shape
        out = (hidden.sum(), width, shape).save()
    return {"reading": reading, "out": out}


@program("shipped")
def script_enum_and_named_tuple(model, **trace):
    span = Span(first=1)
    with model.trace(PROMPT, **trace):
        mlp = Site.MLP.module(model, 0).output[0, span.first:span.last].save()
        site = Site.ATTN
        chosen = (site, tuple(Span(0, 2)), Span._fields).save()
    return {"mlp": mlp, "chosen": chosen}


@program("shipped")
def script_typing_and_descriptors(model, **trace):
    config: Config = {"layer": 0, "k": 4}
    scaler = Scaler.make(1.5)
    with model.trace(PROMPT, **trace):
        logits = model.lm_head.output[0, -1]
        indices, best = top_tokens(logits, tokens_of(config)["k"])
        scaled = Scaler.double(logits[:3]) + scaler.offset * Scaler.factor
        saved = {"indices": indices, "best": best, "factor": Scaler.factor}.save()
        scaled = scaled.save()
    return {"saved": saved, "scaled": scaled}


@program("shipped")
def script_more_constructs(model, **trace):
    stack: Stack[int] = Stack()
    stack.push(2)
    choice = Choice("top", k=2, mode="mean")
    take = functools.partial(top_tokens, k=choice.k)
    with model.trace(PROMPT, **trace):
        logits = model.lm_head.output[0, -1]
        indices, best = take(logits)
        flags = (Perm.R | Perm.W).value
        level = Level.HIGH
        scaled = Scaled(base=float(best))
        saved = {
            "indices": indices, "flags": flags, "rw": Perm.RW.value, "level": level, "top": stack.top(),
            "score": MaxScorer().score(logits[:5]), "scaled": scaled.value, "mode": choice.mode,
            "weight": choice.weight,
        }.save()
    return {"saved": saved}


@program("made")
def made_named_tuples(model, **trace):
    with model.trace(PROMPT, **trace):
        Point = collections.namedtuple("Point", ["x", "y"], defaults=[0])
        logits = model.lm_head.output[0, -1]
        point = Point(float(logits[0]), int(logits.argmax())).save()
        points = [Point(1), Point(2, 3)].save()
    return {"point": point, "points": points}


@program("made")
def made_dataclass_and_enum(model, **trace):
    with model.trace(PROMPT, **trace):
        Pair = dataclasses.make_dataclass("Pair", [("left", int), ("right", float, dataclasses.field(default=0.5))])
        Mode = enum.Enum("Mode", "MEAN MAX")
        logits = model.lm_head.output[0, -1]
        pair = Pair(int(logits.argmax())).save()
        mode = Mode.MAX.save()
        modes = [Mode.MEAN, Mode.MAX].save()
    return {"pair": pair, "mode": mode, "modes": modes}


def _summary(hidden):
    class Summary:
        kind = "layer"

        def __init__(self, mean, top):
            self.mean = mean
            self.top = top

        def describe(self):
            return f"{self.kind}: {self.mean}"

    return Summary(float(hidden.mean()), hidden.max())


def _typed(hidden):
    class Stat(typing.NamedTuple):
        low: float
        high: float

    @dataclasses.dataclass(frozen=True)
    class Bounds:
        stat: Stat
        count: int = 0

    return Bounds(Stat(float(hidden.min()), float(hidden.max())), hidden.numel())


@program("made")
def made_in_a_helper(model, **trace):
    with model.trace(PROMPT, **trace):
        hidden = model.transformer.h[0].output[0]
        summary = _summary(hidden).save()
        bounds = _typed(hidden).save()
    return {"summary": summary, "bounds": bounds}


# --- recording ---------------------------------------------------------------------------


def capturing_backend(sent: dict):
    """The real client's RemoteBackend, keeping a copy of what it POSTs."""
    from nnsight.intervention.backends.remote import RemoteBackend

    class Capturing(RemoteBackend):
        def _post(self, request, blob):
            sent["data"] = request.metadata()
            sent["blob"] = blob
            return super()._post(request, blob)

    return Capturing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--snapshot", required=True, help="the test model's snapshot folder")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import warnings

    import nnsight
    import torch
    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        remote_model = LanguageModel(TEST_REPO)
        local_model = LanguageModel(args.snapshot, dispatch=True)
    for parameter in local_model._module.parameters():
        parameter.requires_grad_(False)

    backend_class = capturing_backend(sent := {})
    recorded, failures = {}, 0
    for name, kind, function in PROGRAMS:
        deep = kind == "made"
        local = function(local_model)
        backend = backend_class(remote_model.to_model_key(), host=args.server,
                                env=remote_model._remoteable_get_env())
        sent.clear()
        try:
            remote = function(remote_model, backend=backend)
            same(describe(remote), describe(local))
            verdict = "same as local"
        except Exception as error:  # a difference is reported, and the request still recorded
            failures += 1
            verdict = f"DIFFERS: {type(error).__name__}: {str(error)[:300]}"
        print(f"{name}: {verdict}", flush=True)
        recorded[name] = {"kind": kind, "data": sent["data"], "blob": sent["blob"],
                          "expected": describe(local, deep)}
    record = {
        "python": sys.version,
        "nnsight": nnsight.__version__,
        "torch": torch.__version__,
        "programs": recorded,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(record, args.out, pickle_protocol=4)
    print(f"recorded {len(recorded)} requests from Python {sys.version.split()[0]} in {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())

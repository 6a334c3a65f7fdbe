"""The models this server may serve, and how a client's model key finds one.

The client names a model with a key ``"import.path.Class:{json}"`` whose JSON
carries the repo id, revision, task and, when set, ``trust_remote_code``. Two
spellings of the same deployment must meet: ``null`` and ``"main"`` are the
same revision, and key order in the JSON is irrelevant. `ModelKey` is that
normalised identity; `ModelSpec` is an operator's entry for one model.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

#: The class every Hugging Face transformers model is keyed by (LanguageModel
#: is a deprecated alias that keys itself as this class).
TRANSFORMERS_CLASS = "nnsight.modeling.transformers.TransformersModel"
#: How nnsight before 0.8 keys a transformers model, with the task each class means
#: (their keys name none): a ``TransformersModel`` of theirs keys itself by the
#: class that defines its key, ``HuggingFaceModel``, of any task.
OLDER_CLASSES: dict[str, Optional[str]] = {
    "nnsight.modeling.language.LanguageModel": "text-generation",
    "nnsight.modeling.vlm.VisionLanguageModel": "image-text-to-text",
    "nnsight.modeling.huggingface.HuggingFaceModel": None,
}


def canonical_class(model_class: str) -> str:
    """The class a deployment is loaded as, for the class a client's key names."""
    return TRANSFORMERS_CLASS if model_class in OLDER_CLASSES else model_class


class InvalidModelKey(ValueError):
    """The client's model key cannot be parsed."""


@dataclass(frozen=True)
class ModelKey:
    """The identity of a deployment, as far as a client's key can name it."""

    model_class: str
    repo_id: str
    revision: str = "main"
    task: Optional[str] = None
    trust_remote_code: bool = False

    @classmethod
    def parse(cls, key: str) -> "ModelKey":
        if not isinstance(key, str) or ":" not in key:
            raise InvalidModelKey(
                f"model_key {key!r} is not of the form 'import.path.Class:{{json}}'."
            )
        model_class, raw = key.split(":", 1)
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as error:
            raise InvalidModelKey(f"model_key's JSON part is invalid: {error}") from None
        if not isinstance(data, dict) or not isinstance(data.get("repo_id"), str):
            raise InvalidModelKey("model_key's JSON part must be an object with a 'repo_id'.")
        revision = data.get("revision") or "main"
        task = data.get("task")
        if not isinstance(revision, str) or not (task is None or isinstance(task, str)):
            raise InvalidModelKey("model_key's 'revision' and 'task' must be strings.")
        if model_class in OLDER_CLASSES:
            # The same deployment as 0.8's key for it: a TransformersModel of that task.
            model_class, task = TRANSFORMERS_CLASS, task or OLDER_CLASSES[model_class]
        return cls(
            model_class=model_class,
            repo_id=data["repo_id"],
            revision=revision,
            task=task,
            trust_remote_code=bool(data.get("trust_remote_code", False)),
        )

    def describe(self) -> str:
        parts = [self.repo_id]
        if self.revision != "main":
            parts.append(f"@{self.revision}")
        if self.task:
            parts.append(f" ({self.task})")
        return "".join(parts)


@dataclass
class ModelSpec:
    """One model the operator allows, and how to load it."""

    repo_id: str
    revision: Optional[str] = None
    task: str = "text-generation"
    model_class: str = TRANSFORMERS_CLASS
    trust_remote_code: bool = False
    #: The dtype weights are held in (None: as stored); with ``quantization``, the compute dtype.
    dtype: Optional[str] = None
    #: Where a HOT replica holds its weights: "cpu", "cuda", "cuda:1", ...
    device: str = "cpu"
    #: Spread the weights over several GPUs of this node: "auto", "balanced",
    #: "sequential", or an explicit ``{module name: device}`` table.
    device_map: "str | dict[str, str | int] | None" = None
    #: The GPUs a strategy ``device_map`` ("auto", ...) may use (default: ``[device]``).
    devices: "list[str | int]" = field(default_factory=list)
    #: Hold the weights quantized: one of nnsight's names (nf4, int4, fp4, int8, fp8).
    quantization: Optional[str] = None
    #: Replicas a HOT deployment keeps (its minimum).
    replicas: int = 1
    #: The most replicas it may grow to while jobs wait (default: ``replicas``).
    max_replicas: Optional[int] = None
    #: Level at start: "hot", "warm" or "cold" (deployed on first request).
    deploy: str = "hot"
    #: Extra keyword arguments for the model class at load.
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    #: Bytes one replica needs on its device (weights plus margin); set by the server.
    size_bytes: Optional[int] = None
    #: Of those, the bytes on each device when HOT (from ``device_map``); set by the server.
    shares: Optional[dict[str, int]] = None

    @property
    def most_replicas(self) -> int:
        return max(self.replicas, self.max_replicas or self.replicas)

    def measure(self, snapshot: Path, margin: float) -> None:
        """Set ``size_bytes`` and ``shares`` from the checkpoint's headers, plus ``margin``."""
        from .sizing import device_shares, tensor_bytes

        sizes = tensor_bytes(snapshot, self.quantization or self.dtype)
        self.size_bytes = int(sum(sizes.values()) * (1 + margin))
        shares = device_shares(sizes, self.device_map, self.devices, self.device)
        self.shares = {device: int(size * (1 + margin)) for device, size in shares.items()}

    def check_load_options(self) -> None:
        """Refuse load options the loader would reject, with what to write instead."""
        from .sizing import DEVICE_MAP_STRATEGIES, QUANTIZATION_BYTES

        if self.quantization is not None and self.quantization.lower() not in QUANTIZATION_BYTES:
            raise ValueError(
                f"{self.repo_id}: quantization {self.quantization!r} is not one nnsight 0.8.1 "
                f"loads; use one of {', '.join(sorted(QUANTIZATION_BYTES))}"
            )
        if self.dtype and self.dtype.lower() in QUANTIZATION_BYTES:
            raise ValueError(
                f"{self.repo_id}: write quantization = {self.dtype!r}; dtype is the compute dtype"
            )
        if isinstance(self.device_map, str):
            if self.device_map not in DEVICE_MAP_STRATEGIES:
                raise ValueError(
                    f"{self.repo_id}: device_map must be one of {', '.join(DEVICE_MAP_STRATEGIES)} "
                    "or a table of module name = device"
                )
        elif self.device_map is not None:
            if not isinstance(self.device_map, dict) or not self.device_map or not all(
                isinstance(key, str) and isinstance(value, (str, int)) for key, value in self.device_map.items()
            ):
                raise ValueError(f"{self.repo_id}: device_map's table must map module names to devices")
        if self.devices and not isinstance(self.device_map, str):
            raise ValueError(f"{self.repo_id}: devices goes with a device_map strategy such as \"auto\"")

    def worker_load_kwargs(self) -> dict[str, Any]:
        """What the worker hands nnsight's loader (and so ``from_pretrained``)."""
        kwargs = dict(self.load_kwargs)
        if self.quantization:
            # nnsight takes the held-as format in ``dtype``; the compute dtype goes beside it.
            kwargs["dtype"] = self.quantization.lower()
            if self.dtype:
                kwargs["compute_dtype"] = self.dtype
        elif self.dtype:
            kwargs["dtype"] = self.dtype
        if self.device_map is not None:
            kwargs["device_map"] = self._loader_device_map()
        if self.trust_remote_code:
            kwargs["trust_remote_code"] = True
        return kwargs

    def _loader_device_map(self) -> "str | dict[str, str | int]":
        if isinstance(self.device_map, str):
            return self.device_map
        # accelerate takes a GPU as its index; "cpu" and "disk" as written.
        return {
            key: int(value.split(":", 1)[1]) if isinstance(value, str) and value.startswith("cuda:")
            else (0 if value == "cuda" else value)
            for key, value in (self.device_map or {}).items()
        }

    def placement_devices(self) -> list[str]:
        """The devices a HOT replica's weights occupy."""
        return list(self.hot_shares())

    def hot_shares(self) -> dict[str, int]:
        """Bytes on each device of one HOT replica (all on ``device`` without a map)."""
        from .sizing import normalise_device

        if self.shares:
            return dict(self.shares)
        if isinstance(self.device_map, dict):
            devices = list(dict.fromkeys(normalise_device(v) for v in self.device_map.values()))
        elif isinstance(self.device_map, str):
            devices = [normalise_device(d) for d in self.devices] or [normalise_device(self.device)]
        else:
            devices = [self.device]
        size = self.size_bytes or 0
        share = -(-size // len(devices))
        return {device: share for device in devices}

    @property
    def name(self) -> str:
        return self.repo_id if not self.revision else f"{self.repo_id}@{self.revision}"

    @property
    def key(self) -> ModelKey:
        return ModelKey(
            self.model_class,
            self.repo_id,
            self.revision or "main",
            self.task,
            self.trust_remote_code,
        )

    def model_key(self) -> str:
        """The key the worker loads from, in the form the client mints it."""
        data: dict[str, Any] = {"repo_id": self.repo_id, "revision": self.revision}
        if self.trust_remote_code:
            data["trust_remote_code"] = True
        if self.model_class == TRANSFORMERS_CLASS:
            # Only transformers' wrapper takes a task: a diffusers pipeline's key has
            # none, and a task handed to it would reach `from_pretrained` as a stray kwarg.
            data["task"] = self.task
        return f"{self.model_class}:{json.dumps(data)}"


@dataclass(frozen=True)
class AllowRule:
    """An operator's ``[[allow]]`` entry: models fetched from the Hub on first request.

    ``repo_id`` is a pattern (``fnmatch``: ``"org/*"``, ``"*"``); the first entry
    that matches a request's repo id decides. ``max_size`` bounds the weights as
    they will be held (in ``dtype``), read from the safetensors headers before
    anything is downloaded.
    """

    repo_id: str
    #: Largest weights accepted, in bytes as held in ``dtype`` (a size such as "2GB" in TOML).
    max_size: int
    dtype: Optional[str] = None
    device: str = "cpu"
    #: The task used when the client's key names none (older clients).
    task: str = "text-generation"
    model_class: str = TRANSFORMERS_CLASS
    #: Let a matching key ask for the repository's own code. Never by default.
    trust_remote_code: bool = False

    def matches(self, key: ModelKey) -> bool:
        return (
            key.model_class == self.model_class
            and fnmatch.fnmatchcase(key.repo_id, self.repo_id)
            and (self.trust_remote_code or not key.trust_remote_code)
        )

    def spec(self, key: ModelKey) -> ModelSpec:
        """How a model this rule allows is deployed: COLD until asked for, one replica."""
        return ModelSpec(
            repo_id=key.repo_id,
            revision=None if key.revision == "main" else key.revision,
            task=key.task or self.task,
            model_class=key.model_class,
            trust_remote_code=key.trust_remote_code,
            dtype=self.dtype,
            device=self.device,
            deploy="cold",
        )

    def describe(self) -> str:
        from ..units import format_size

        return f"{self.repo_id} (up to {format_size(self.max_size)})"


class Catalog:
    """The set of models served, looked up by a client's key.

    Besides the operator's listed models it holds the ``[[allow]]`` rules; a model
    fetched on demand is added with `add` and dropped with `remove` when its
    files are deleted. Listed models are never removed.
    """

    def __init__(self, specs: Iterable[ModelSpec], allowed: Iterable[AllowRule] = ()) -> None:
        self.specs: dict[str, ModelSpec] = {}
        self.allowed = list(allowed)
        #: The names of the models added on demand (`add`).
        self.fetched: set[str] = set()
        for spec in specs:
            if spec.name in self.specs:
                raise ValueError(f"model {spec.name!r} is listed twice")
            self.specs[spec.name] = spec

    def allowance(self, key: ModelKey) -> Optional[AllowRule]:
        """The ``[[allow]]`` rule that lets ``key`` be fetched on demand, if any."""
        return next((rule for rule in self.allowed if rule.matches(key)), None)

    def add(self, spec: ModelSpec) -> None:
        """Serve a model fetched on demand."""
        self.specs[spec.name] = spec
        self.fetched.add(spec.name)

    def remove(self, name: str) -> None:
        """Stop serving a model fetched on demand (never a listed one)."""
        if name in self.fetched:
            self.fetched.discard(name)
            self.specs.pop(name, None)

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self.specs.values())

    def match(self, key: ModelKey) -> Optional[ModelSpec]:
        for spec in self.specs.values():
            own = spec.key
            # An older client leaves the task out of its key: any task matches.
            if key.task is None:
                own = ModelKey(own.model_class, own.repo_id, own.revision, None, own.trust_remote_code)
            if own == key:
                return spec
        return None

    def hosts_repo(self, repo_id: str) -> bool:
        return any(spec.repo_id == repo_id for spec in self.specs.values())

    def describe(self) -> str:
        served = ", ".join(spec.key.describe() for spec in self.specs.values()) or "none"
        if self.allowed:
            rules = "; ".join(rule.describe() for rule in self.allowed)
            served += f"; fetched on request from the Hub: {rules}"
        return served

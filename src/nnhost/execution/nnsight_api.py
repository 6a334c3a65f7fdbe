"""What a job process calls of nnsight, for each generation of its API.

Why it exists: the job side (the template, the runner, the unpickler) runs
under whichever nnsight its process imports, the server's own or a runtime's
(`nnhost.runtimes`), and two generations of nnsight differ in what the
server must do with a request:

* **0.8** sends the tracer and its block as source; the server runs
  ``tracer.execute(tracer.info.code)`` inside a trace scope and picks the
  saved values out of the block's frame. Models are keyed as
  ``TransformersModel`` and take a per-request ``env``.
* **0.6 and 0.7** send a pickled ``RequestModel``: the tracer, the client's
  model wrapper by value (its modules, tokenizer and interleaver by
  reference) and the block compiled into a function shipped as source; the
  call returns the saved values. A language model is keyed and rebuilt as
  ``LanguageModel``; there is no ``env``.

Each difference lives here, once, behind `NnsightApi`; callers ask `current()`
and never compare versions. It must never be imported by the API or the
controller (they run no nnsight), and it never decides whether a request may
run: the unpickler and the sandbox do.
"""

from __future__ import annotations

import functools
import io
import json
from typing import Any, Callable, Optional

from ..models.catalog import OLDER_CLASSES, TRANSFORMERS_CLASS

#: The wrappers 0.6 and 0.7 key and rebuild a transformers model of these tasks as
#: (the catalog's table of their classes, read the other way).
LEGACY_WRAPPERS = {task: wrapper for wrapper, task in OLDER_CLASSES.items() if task is not None}


class NnsightApi:
    """The server's side of one generation of nnsight's remote protocol."""

    #: The generation's name, in messages: ``"0.8"`` or ``"0.6-0.7"``.
    generation: str = ""

    def from_model_key(self, model_key: str, **kwargs: Any) -> Any:
        raise NotImplementedError

    def preload(self) -> None:
        """Import the model wrappers (before a process is shut in, and before it forks)."""
        import nnsight.modeling.language  # type: ignore[import-untyped]  # noqa: F401

    def own_request(self, model: Any, prompt: str) -> bytes:
        """A request of the server's own (the warm-up), serialized as this generation's client would."""
        raise NotImplementedError

    def deserialize(self, blob: bytes, objects: dict[str, Any], compress: bool,
                    unpickler: Optional[type]) -> Any:
        """The request, rebuilt against the live model's ``objects``."""
        raise NotImplementedError

    def execute(self, request: Any) -> dict[str, Any]:
        """Run the request's block; the values it saved, by name."""
        raise NotImplementedError

    def forget(self) -> None:
        """Drop what nnsight keeps between requests: sources, compiled blocks, saved ids."""
        raise NotImplementedError

    def get_env(self, model: Any) -> dict[str, Any]:
        return {}

    def set_env(self, model: Any, env: dict[str, Any]) -> None:
        if env:
            raise ValueError(f"nnsight {self.generation} takes no model settings")


class Current(NnsightApi):
    """nnsight 0.8: a tracer and its block, run in a trace scope."""

    generation = "0.8"

    def from_model_key(self, model_key: str, **kwargs: Any) -> Any:
        from nnsight.modeling.mixins.remotable import Remotable  # type: ignore[import-untyped]

        return Remotable.from_model_key(model_key, **kwargs)

    def own_request(self, model: Any, prompt: str) -> bytes:
        from nnsight.schema.request import RequestModel  # type: ignore[import-untyped]

        captured: dict[str, bytes] = {}

        def capture(tracer: Any) -> None:
            captured["blob"] = RequestModel.serialize(tracer, True)

        with model.trace(prompt, backend=capture):
            model.output.save()
        return captured["blob"]

    def deserialize(self, blob: bytes, objects: dict[str, Any], compress: bool,
                    unpickler: Optional[type]) -> Any:
        from nnsight.schema.request import RequestModel

        kwargs = {} if unpickler is None else {"unpickler": unpickler}
        return RequestModel.deserialize(blob, objects, compress, **kwargs)

    def execute(self, request: Any) -> dict[str, Any]:
        from nnsight.tracing.tracer import _saves, dec, inc  # type: ignore[import-untyped]

        inc()
        try:
            request.execute(request.info.code)
            saved_ids = _saves()
            return {
                name: value
                for name, value in request.info.frame.f_locals.items()
                if id(value) in saved_ids
            }
        finally:
            dec()

    def forget(self) -> None:
        from nnsight.tracing.globals import BLOCKS, SOURCES  # type: ignore[import-untyped]

        SOURCES.clear()
        BLOCKS.clear()

    def get_env(self, model: Any) -> dict[str, Any]:
        return dict(model._remoteable_get_env())

    def set_env(self, model: Any, env: dict[str, Any]) -> None:
        model._remoteable_set_env(env)


class Legacy(NnsightApi):
    """nnsight 0.6 and 0.7: a pickled ``RequestModel`` whose function returns the saved values."""

    generation = "0.6-0.7"

    def from_model_key(self, model_key: str, **kwargs: Any) -> Any:
        from nnsight.modeling.mixins.remoteable import RemoteableMixin  # type: ignore[import-untyped]

        key, extra = legacy_model_key(model_key)
        model = RemoteableMixin.from_model_key(key, **extra, **kwargs)
        if not kwargs.get("dispatch"):
            load_light_components(model)
        return model

    def own_request(self, model: Any, prompt: str) -> bytes:
        from nnsight.intervention.backends.base import Backend  # type: ignore[import-untyped]
        from nnsight.schema.request import RequestModel

        captured: dict[str, bytes] = {}

        class Capture(Backend):  # type: ignore[misc]
            def __call__(self, tracer: Any) -> None:
                interventions = super().__call__(tracer)
                captured["blob"] = RequestModel(interventions=interventions, tracer=tracer).serialize(True)

        with model.trace(prompt, backend=Capture()):
            model.output.save()
        return captured["blob"]

    def deserialize(self, blob: bytes, objects: dict[str, Any], compress: bool,
                    unpickler: Optional[type]) -> Any:
        from nnsight.intervention.serialization import CustomCloudUnpickler  # type: ignore[import-untyped]

        if compress:
            import zstandard

            blob = zstandard.ZstdDecompressor().decompress(blob)
        reader: Callable[..., Any] = unpickler or CustomCloudUnpickler
        return reader(io.BytesIO(blob), objects).load()

    def execute(self, request: Any) -> dict[str, Any]:
        from nnsight.intervention.tracing.globals import Globals  # type: ignore[import-untyped]

        # 0.6 enters its trace scope (which gives every value ``.save()``) in
        # its execution backend; 0.7 does it as the tracer sets up.
        scoped = hasattr(Globals, "enter")
        if scoped:
            Globals.enter()
        try:
            saves = request.tracer.execute(request.interventions)
        finally:
            if scoped:
                Globals.exit()
        return dict(saves) if isinstance(saves, dict) else {}

    def forget(self) -> None:
        from nnsight.intervention.tracing.globals import Globals

        Globals.saves.clear()
        Globals.cache.clear()


def load_light_components(model: Any) -> None:
    """Give a meta-built 0.6/0.7 diffusion pipeline the parts it would load on dispatch.

    Their meta build leaves each pipeline component that is not a module (the
    scheduler, a feature extractor) as None, for `dispatch` to load with the
    weights; a template never dispatches (its jobs bind the host's weights),
    so these small parts, which hold no weights, are loaded here from the
    model's own files.
    """
    import importlib

    import torch

    pipeline = getattr(getattr(model, "_model", None), "pipeline", None)
    config = getattr(model, "config", None)
    if pipeline is None or not isinstance(config, dict):
        return
    for name, entry in config.items():
        if name.startswith("_") or not isinstance(entry, list) or len(entry) != 2:
            continue
        if getattr(pipeline, name, None) is not None or None in entry:
            continue
        library, class_name = entry
        component: Any = getattr(importlib.import_module(library), class_name, None)
        if not isinstance(component, type) or issubclass(component, torch.nn.Module):
            continue
        loader: Any = component
        loaded = loader.from_pretrained(model.repo_id, subfolder=name, revision=model.revision)
        pipeline.register_modules(**{name: loaded})


def legacy_model_key(model_key: str) -> tuple[str, dict[str, Any]]:
    """The deployment's key as 0.6 and 0.7 build it, and what their wrapper takes beside it.

    Their clients pickle their own wrapper, whose persistent objects (the
    tokenizer, the processor) the server's model must hold under the same
    ids: a text-generation model is their ``LanguageModel``, an
    image-text-to-text one their ``VisionLanguageModel``. Their
    ``TransformersModel`` takes no task, but the auto class the task loads
    with (``automodel``).
    """
    model_class, raw = model_key.split(":", 1)
    if model_class != TRANSFORMERS_CLASS:
        return model_key, {}
    data = json.loads(raw)
    task = data.pop("task", None) or "text-generation"
    wrapper = LEGACY_WRAPPERS.get(task)
    if wrapper is not None:
        return f"{wrapper}:{json.dumps(data)}", {}
    from transformers.pipelines import SUPPORTED_TASKS

    entry: Any = SUPPORTED_TASKS.get(task)
    if entry is None:
        raise ValueError(f"nnsight 0.6 and 0.7 have no wrapper for {task} models")
    return f"{TRANSFORMERS_CLASS}:{json.dumps(data)}", {"automodel": entry["pt"][0]}


@functools.lru_cache(maxsize=1)
def current() -> NnsightApi:
    """The generation of the nnsight this process imports."""
    import importlib.util

    if importlib.util.find_spec("nnsight.tracing") is not None:
        return Current()
    return Legacy()

"""Write the payloads of `test_legacy_payloads`: run with the Python of a 0.6 or 0.7 client.

``python legacy_payloads.py SNAPSHOT OUT``: each case is the request a client
of this nnsight version serializes (its own `RequestModel`, its own
pickler) for a small trace whose block reaches one hostile object, written
to ``OUT/<case>.bin`` uncompressed; ``normal.bin`` is a harmless request, and
``normal-local.pt`` what the same trace saves when run here, locally.

The hostile objects are pickled as nnsight's pickler would pickle them (by
reference for a library's function, by value with a ``__reduce__`` of the
user's), so that the server reads exactly what a hostile user of this
version could send.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

warnings.simplefilter("ignore")

import torch  # noqa: E402
from nnsight import LanguageModel  # noqa: E402
from nnsight.intervention import serialization  # noqa: E402
from nnsight.intervention.backends.base import Backend  # noqa: E402
from nnsight.schema.request import RequestModel  # noqa: E402

PROMPT = "The Eiffel Tower is in the city of"
snapshot, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
model = LanguageModel(snapshot)


class Capture(Backend):
    """Serializes the trace as the client would send it; ``block`` replaces the compiled block."""

    def __init__(self, name: str, block=None) -> None:
        self.name, self.block = name, block

    def __call__(self, tracer):
        interventions = super().__call__(tracer)
        request = RequestModel(interventions=self.block or interventions, tracer=tracer)
        (out / f"{self.name}.bin").write_bytes(request.serialize(False))


class Reduced:
    """An object the server rebuilds by calling ``function(*args)``."""

    def __init__(self, function, *args) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def helper_importing_os(x):
    return x


helper_importing_os.__source__ = "def helper_importing_os(x):\n    import os\n    return x\n"


def capture(name: str, hostile=None, block=None, **trace) -> None:
    with model.trace(PROMPT, backend=Capture(name, block), **trace):
        reached = hostile  # noqa: F841 - the block reaches it: it travels with the request
        logits = model.lm_head.output.save()  # noqa: F841


capture("normal")
capture("calls_os_system", Reduced(os.system, "touch /tmp/nnhost-legacy-pwned"))
capture("ships_source_that_imports_os", helper_importing_os)
capture("fills_a_server_function",
        Reduced(serialization._source_function_setstate, serialization.make_frame,
                ({}, {"__globals__": {"os": "os"}})))
capture("names_a_transformers_loader", Reduced(__import__("transformers").utils.hub.cached_file, "x", "y"))
capture("calls_a_model_loader", Reduced(__import__("transformers").AutoModelForCausalLM.from_pretrained, "/etc"))
capture("runs_a_server_function_as_its_block", block=serialization.make_frame)
capture("traces_a_private_method", fn=model._module._apply)  # the server calls the model's `_apply`

local = LanguageModel(snapshot, dispatch=True)
with local.trace(PROMPT):
    logits = local.lm_head.output.save()
torch.save({"logits": logits}, out / "normal-local.pt")
print("WROTE", *sorted(path.name for path in out.iterdir()))

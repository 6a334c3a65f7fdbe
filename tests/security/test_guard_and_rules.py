"""The model guard and the sandbox's rules, exercised directly (no server)."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

from nnhost.execution.guard.integrity import ModelGuard
from nnhost.execution.python_layer.sandbox import (
    ImportRefused,
    SandboxPolicy,
    SandboxViolation,
    check_source,
    guarded_builtins,
)
from nnhost.execution.python_layer.sandbox_rules import DEFAULT_ALLOWED_IMPORTS

PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture
def fresh_model(test_snapshot):
    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LanguageModel(str(test_snapshot), dispatch=True)
    for parameter in model._module.parameters():
        parameter.requires_grad_(False)
    return model


def logits_of(model):
    tokens = model.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        return model._module(**tokens).logits.clone()


def test_guard_undoes_what_a_job_changed(fresh_model):
    model = fresh_model
    before = logits_of(model)
    guard = ModelGuard(model, model._remoteable_persistent_objects())
    assert guard.image is not None and guard.image.tensors > 0
    torch.testing.assert_close(logits_of(model), before)  # the read-only image holds the same weights
    module = model._module
    block = module.transformer.h[0]
    block.mlp.register_forward_hook(lambda m, i, o: o * 0)
    block.attn.c_attn.weight.data = torch.zeros_like(block.attn.c_attn.weight)
    block.mlp.c_fc.weight = torch.nn.Parameter(torch.zeros_like(block.mlp.c_fc.weight))
    block.planted = "a reference that outlives the job"
    module.config.n_layer = 99
    model.tokenizer.verbose = "changed"
    original_gelu = torch.nn.functional.gelu
    torch.nn.functional.gelu = lambda x, approximate="none": x * 0
    torch.set_default_dtype(torch.float64)
    assert not torch.allclose(logits_of(model).float(), before)

    report = guard.restore()
    assert not report.fatal, report.fatal
    described = "; ".join(report.restored).lower()
    for change in ("_forward_hooks", "planted", "parameter weight", "default dtype", "tokenizer: replaced verbose"):
        assert change in described, described
    assert torch.nn.functional.gelu is original_gelu
    assert torch.get_default_dtype() is torch.float32
    assert module.config.n_layer != 99 and not hasattr(block, "planted")
    torch.testing.assert_close(logits_of(model), before)
    assert guard.restore().restored == []  # nothing left to undo


def test_guard_reports_what_it_cannot_undo(fresh_model):
    model = fresh_model
    guard = ModelGuard(model, model._remoteable_persistent_objects(), read_only_weights=False)
    with torch.no_grad():
        model._module.lm_head.weight.add_(1.0)  # without the image, only a checksum sees this
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        report = guard.restore()
    finally:
        stop.set()
        thread.join()
    assert "a weight's values changed" in report.fatal
    assert "the request left a thread running" in report.fatal


@pytest.mark.parametrize(
    "source, complaint",
    [
        ("import os", "importing 'os' is not allowed"),
        ("from torch import hub", "'hub' is not available"),
        ("x = y.__class__", "'__class__' is not available"),
        ("x = f.__globals__", "'__globals__'"),
        ("eval('1')", "'eval' is not available"),
        ("x = globals()", "'globals' is not available"),
        ("class A:\n    def __del__(self):\n        pass", "defining __del__"),
        ("match x:\n    case int(__class__=c):\n        pass", "'__class__'"),
        ("from . import sibling", "relative imports"),
        ("from torch import *", "import *"),
    ],
)
def test_source_rules(source, complaint):
    with pytest.raises(SandboxViolation, match=complaint.replace("(", r"\(").replace("*", r"\*")):
        check_source(source, "user.py", SandboxPolicy())


def test_legitimate_sources_pass():
    check_source(
        "import torch, math, numpy as np\nfrom collections import OrderedDict\n"
        "hidden = model.transformer.h[0].output.save()\nx = model.config._attn_implementation\n"
        "class Doubler(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "    def forward(self, x):\n        return x * 2\n",
        "user.py",
        SandboxPolicy(),
    )


def test_a_remembered_verdict_is_the_same_verdict():
    """`check_source` remembers verdicts (a user's loop ships the same sources): a refusal
    stays a refusal with its text, and each policy and file name gets its own verdict."""
    source = "import json\nx = ().__class__\n"
    narrow, wide = SandboxPolicy.from_names(["math"]), SandboxPolicy.from_names(["math", "json"])
    for _ in range(3):
        with pytest.raises(SandboxViolation, match=r"(?s)loop\.py, line 1: importing 'json'.*line 2"):
            check_source(source, "loop.py", narrow)
    for _ in range(3):
        with pytest.raises(SandboxViolation) as refused:
            check_source(source, "loop.py", wide)
        assert "line 1" not in str(refused.value) and "loop.py, line 2" in str(refused.value)
        check_source("import json\n", "loop.py", wide)
        with pytest.raises(SandboxViolation, match="other.py, line 2"):
            check_source(source, "other.py", wide)
    with pytest.raises(SandboxViolation, match="json"):
        check_source("import json\n", "loop.py", narrow)


def test_guarded_builtins_apply_the_policy_at_run_time():
    policy = SandboxPolicy.from_names(["math", "builtins"])
    namespace = {"__builtins__": guarded_builtins(policy)}
    exec("import math\nvalue = math.sqrt(4)", namespace)
    assert namespace["value"] == 2
    with pytest.raises(ImportRefused, match=r"importing 'torch' is not allowed.*Modules you may import: math, builtins"):
        exec("import torch", namespace)
    with pytest.raises(AttributeError, match="'__class__'"):
        exec("getattr(1, '__cla' + 'ss__')", namespace)
    exec("import builtins\nnames = dir(builtins)", namespace)
    assert "open" not in namespace["names"] and "eval" not in namespace["names"]


def test_operator_can_change_the_allowlist():
    policy = SandboxPolicy.from_names(["math", "json"])
    check_source("import json", "user.py", policy)
    with pytest.raises(SandboxViolation, match="numpy"):
        check_source("import numpy", "user.py", policy)
    assert SandboxPolicy.from_names(None).allowed_imports == DEFAULT_ALLOWED_IMPORTS

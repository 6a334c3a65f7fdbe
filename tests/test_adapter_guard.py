"""The per-request adapter where every job shares one process: under the integrity guard.

On an accelerator the replica's process runs every job itself (a CUDA context
cannot cross a fork), and `integrity.ModelGuard` undoes what each job changed.
No accelerator here, so the `Runner` of that design is driven directly, on the
CPU, with the guard, with payloads the real client serialized and the
adapter's files handed over as descriptors as `execution.handoff` does: the
adapted job sees the adapter, the guard finds nothing to undo or to condemn,
and the next job's values are the base model's, bit for bit.
"""

from __future__ import annotations

import os
import warnings

import torch
from conftest import TEST_REPO

from nnhost.models.adapters import ADAPTER_FILES

ADAPTER = "nnhost-test/tiny-gpt2-lora"
PROMPT = "The Eiffel Tower is in the city of"


class _Capture:
    """What the client's remote backend would send, kept instead of sent."""

    blob = b""

    def __call__(self, tracer) -> None:
        from nnsight.schema.request import RequestModel

        self.blob = RequestModel.serialize(tracer, False)


def _payload(model, adapted: bool) -> bytes:
    capture = _Capture()
    with model.trace(PROMPT, backend=capture):
        if adapted:
            low_rank = model.transformer.h[0].attn.c_attn.lora_A.default.output.save()
        logits = model.lm_head.output.save()
    return capture.blob


def _run(runner, blob: bytes, env: dict, adapter, tmp_path, name: str):
    from nnhost.execution.events import JobSpec

    read, write = os.pipe()
    os.write(write, blob)
    os.close(write)
    fds = [os.open(adapter / file, os.O_RDONLY) for file in ADAPTER_FILES] if "peft" in env else []
    result = tmp_path / f"{name}.result"
    spec = JobSpec(name, "", False, env=env, result_path=str(result), payload_fd=read, adapter_fds=fds)
    events: list = []
    intact = runner.run(spec, events.append)
    for fd in fds:
        os.close(fd)
    final = [event for event in events if event.status in ("COMPLETED", "ERROR")]
    assert [event.status for event in final] == ["COMPLETED"], final
    assert "changed the shared model" not in final[0].description, final[0].description
    return intact, torch.load(result, weights_only=False)


def test_the_guarded_one_process_design_applies_and_removes_the_adapter(
    server_hf_home, test_snapshot, tmp_path
):
    from nnsight import LanguageModel

    from nnhost.execution.guard.integrity import ModelGuard
    from nnhost.execution.job.runner import Runner
    from nnhost.models.tiny_lora import build_tiny_lora

    adapter = build_tiny_lora(ADAPTER, test_snapshot, TEST_REPO, server_hf_home)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        served = LanguageModel(str(test_snapshot), dispatch=True)
        base_client = LanguageModel(str(test_snapshot))
        adapted_client = LanguageModel(str(test_snapshot), peft=str(adapter))
        adapted_local = LanguageModel(str(test_snapshot), peft=str(adapter), dispatch=True)
    for parameter in served._module.parameters():
        parameter.requires_grad_(False)
    runner = Runner(served)
    runner.guard = ModelGuard(served, runner.persistent_objects, read_only_weights=False)
    base_env = {"attn_implementation": served.attn_implementation}

    intact, before = _run(runner, _payload(base_client, False), base_env, adapter, tmp_path, "before")
    assert intact
    intact, adapted = _run(runner, _payload(adapted_client, True), {**base_env, "peft": ADAPTER},
                           adapter, tmp_path, "adapted")
    assert intact
    intact, after = _run(runner, _payload(base_client, False), base_env, adapter, tmp_path, "after")
    assert intact

    assert torch.equal(before["logits"], after["logits"])
    with adapted_local.trace(PROMPT):
        logits = adapted_local.lm_head.output.save()
    torch.testing.assert_close(adapted["logits"], logits)
    assert not torch.allclose(adapted["logits"], before["logits"])
    # The shared model is the base again: no adapter module left in its tree.
    assert served.peft is None
    assert not any("lora" in name for name, _ in served._module.named_modules())

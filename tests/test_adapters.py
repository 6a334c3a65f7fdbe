"""A PEFT adapter per request: applied for that job only, from the server's own cache.

The real client opens the served GPT-2 with ``peft=ADAPTER``; its meta model
reads the adapter's config through the server's Hub mirror, and each request
carries the adapter in its ``env``. The server applies it in the job's own
process, from files it hands over (the job never sees the cache), and the
next job sees the base model. Every result is compared with the same program
run locally on the same weights and adapter.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from compare import assert_same
from conftest import TEST_REPO
from nnsight.intervention.backends.remote import RemoteBackend, RemoteError

ADAPTER = "nnhost-test/tiny-gpt2-lora"
PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture(scope="module")
def adapter_snapshot(server_hf_home, test_snapshot):
    from nnhost.models.tiny_lora import build_tiny_lora

    return build_tiny_lora(ADAPTER, test_snapshot, TEST_REPO, server_hf_home)


def _open(source, **kwargs):
    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LanguageModel(source, **kwargs)
    if kwargs.get("dispatch"):
        for parameter in model._module.parameters():
            parameter.requires_grad_(False)
    return model


@pytest.fixture(scope="module")
def adapted_remote(server, adapter_snapshot):
    return _open(TEST_REPO, peft=ADAPTER)


@pytest.fixture(scope="module")
def adapted_local(test_snapshot, adapter_snapshot):
    return _open(str(test_snapshot), peft=str(adapter_snapshot), dispatch=True)


def adapted_program(model, remote):
    """Read the adapter's own module, steer the adapted attention, and read the logits."""
    with model.trace(PROMPT, remote=remote):
        low_rank = model.transformer.h[0].attn.c_attn.lora_A.default.output.save()
        model.transformer.h[1].attn.c_attn.output[:, -1] *= 0.5
        logits = model.lm_head.output[:, -1].save()
    return {"low_rank": low_rank, "logits": logits}


def base_program(model, remote):
    with model.trace(PROMPT, remote=remote):
        logits = model.lm_head.output[:, -1].save()
    return {"logits": logits}


def test_adapter_applies_for_its_job_and_the_next_sees_the_base(
    adapted_remote, adapted_local, remote_model, local_model
):
    adapted = adapted_program(adapted_remote, True)
    assert_same(adapted, adapted_program(adapted_local, False))
    base = base_program(remote_model, True)
    assert_same(base, base_program(local_model, False))
    assert not torch.allclose(adapted["logits"], base["logits"]), "the adapter changed nothing"
    # Adapted again, then base again: nothing carries over either way.
    assert_same(adapted_program(adapted_remote, True), adapted)
    assert_same(base_program(remote_model, True), base)


def _send_with_adapter(remote_model, adapter):
    """The client's own backend, with the env a ``peft=`` model would send, naming ``adapter``."""
    env = {"attn_implementation": remote_model.attn_implementation, "peft": adapter}
    with remote_model.trace(PROMPT, backend=RemoteBackend(remote_model.to_model_key(), env=env)):
        logits = remote_model.lm_head.output.save()
    return logits


@pytest.mark.parametrize("adapter, said", [
    ("nnhost-test/no-such-adapter", "not in this server's model cache"),
    (TEST_REPO, "not in this server's model cache"),  # a model, not an adapter
    ("/etc", "not a Hub id"),
    ("nnhost-test/../../etc", "not a Hub id"),
])
def test_an_adapter_the_server_does_not_serve_is_an_error(server, remote_model, adapter_snapshot, adapter, said):
    with pytest.raises(RemoteError) as refused:
        _send_with_adapter(remote_model, adapter)
    assert said in str(refused.value)
    if "cache" in said:
        assert ADAPTER in str(refused.value)  # what is served instead


def test_the_mirror_serves_the_adapter_config_not_its_weights(server, adapter_snapshot):
    import httpx

    base = f"{server.url}/hub/{ADAPTER}/resolve/main"
    assert httpx.get(f"{base}/adapter_config.json").status_code == 200
    assert httpx.get(f"{base}/adapter_model.safetensors").status_code != 200


@pytest.fixture(scope="module", params=["mapped", "one-process"])
def design_server(request, root, server_hf_home, test_snapshot, adapter_snapshot):
    """The other ways a job runs: mapped weights, and every job in one process (trusted mode).

    In the one-process design the adapter is taken out again after the job
    (the model is shared by every job), so the base must come back exactly.
    """
    from conftest import API_KEY

    from nnhost.testing import ServerProcess

    env = {"mapped": {"NNHOST_EXECUTION": "mapped"}, "one-process": {"NNHOST_CONTAINMENT": "false"}}
    process = ServerProcess(
        [TEST_REPO], data_dir=root / f"adapter-{request.param}-data", hf_home=server_hf_home,
        api_key=API_KEY, env=env[request.param],
    )
    process.start()
    yield process
    process.stop()


def test_adapter_in_every_execution_design(design_server, adapted_remote, adapted_local, remote_model, local_model):
    from conftest import API_KEY
    from test_accounts import as_client, new_key

    other_user = new_key(design_server, "other@example.org")
    with as_client(design_server, API_KEY):
        adapted = adapted_program(adapted_remote, True)
    assert_same(adapted, adapted_program(adapted_local, False))
    # Another user's job, right after: the base model, whatever the last job applied.
    with as_client(design_server, other_user):
        base = base_program(remote_model, True)
    assert_same(base, base_program(local_model, False))
    assert not torch.allclose(adapted["logits"], base["logits"]), "the adapter changed nothing"
    with as_client(design_server, API_KEY):
        assert_same(adapted_program(adapted_remote, True), adapted)
        assert_same(base_program(remote_model, True), base)

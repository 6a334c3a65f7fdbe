"""End to end: the real nnsight client against a real nnhost server.

Each program runs twice, remotely (against the server) and locally (against the
same weights in this process), and the saved values must agree.
"""

from __future__ import annotations

import asyncio

import nnsight
import pytest
import torch
from compare import assert_same

PROMPT = "The Eiffel Tower is in the city of"
OTHER = "The Colosseum is in the city of"


@pytest.fixture(params=[True, False], ids=["compress", "no-compress"])
def compress(request):
    from nnsight import CONFIG

    previous = CONFIG.API.COMPRESS
    CONFIG.API.COMPRESS = request.param
    yield request.param
    CONFIG.API.COMPRESS = previous


def both(program, remote_model, local_model, **kwargs):
    remote = program(remote_model, True, **kwargs)
    local = program(local_model, False, **kwargs)
    assert_same(remote, local)
    return remote


def trace_with_saves(model, remote):
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].output.save()
        logits = model.lm_head.output.save()
    return {"hidden": hidden, "logits": logits}


def test_trace_returns_saved_values(server, remote_model, local_model, compress):
    result = both(trace_with_saves, remote_model, local_model)
    assert result["logits"].shape[-1] == remote_model.config.vocab_size


def set_and_modify(model, remote):
    with model.trace(PROMPT, remote=remote):
        model.transformer.h[0].output[:, 2:4] = 0
        edited = model.transformer.h[0].output.save()
        model.transformer.h[1].mlp.output = model.transformer.h[1].mlp.output * 2
        logits = model.lm_head.output.save()
    return {"edited": edited, "logits": logits}


def test_interventions_set_and_modify_outputs(server, remote_model, local_model):
    result = both(set_and_modify, remote_model, local_model)
    assert torch.all(result["edited"][:, 2:4] == 0)
    plain = trace_with_saves(local_model, False)["logits"]
    assert not torch.allclose(plain, result["logits"]), "the interventions changed nothing"


def several_invokes(model, remote):
    with model.trace(remote=remote) as tracer:
        with tracer.invoke(PROMPT):
            first = model.lm_head.output[:, -1].save()
        with tracer.invoke(OTHER):
            second = model.lm_head.output[:, -1].save()
        with tracer.invoke():
            everything = model.lm_head.output.save()
    return {"first": first, "second": second, "everything": everything}


def test_several_invokes_in_one_trace(server, remote_model, local_model):
    result = both(several_invokes, remote_model, local_model)
    assert result["everything"].shape[0] == 2


def session_sharing_values(model, remote):
    with model.session(remote=remote):
        with model.trace(PROMPT):
            eiffel = model.transformer.h[-1].output[:, -1, :]
        with model.trace(OTHER):
            model.transformer.h[-1].output[:, -1, :] = eiffel
            patched = model.lm_head.output[:, -1].save()
        with model.trace(OTHER):
            doubled_input = model.transformer.h[0].output * 2
            model.transformer.h[0].output = doubled_input
            final = model.lm_head.output[:, -1].save()
    return {"patched": patched, "final": final}


def test_session_with_three_traces_sharing_values(server, remote_model, local_model):
    both(session_sharing_values, remote_model, local_model)


def generate_with_iter(model, remote):
    with model.generate(PROMPT, max_new_tokens=3, remote=remote) as tracer:
        tokens = list().save()
        with tracer.iter[:]:
            tokens.append(model.lm_head.output[0][-1].argmax(dim=-1))
    return {"tokens": tokens}


def generate_result(model, remote):
    with model.generate(PROMPT, max_new_tokens=3, remote=remote) as tracer:
        output = tracer.result.save()
    return {"output": output}


def test_generate_with_iter_and_result(server, remote_model, local_model):
    tokens = both(generate_with_iter, remote_model, local_model)["tokens"]
    assert len(tokens) == 3
    output = both(generate_result, remote_model, local_model)["output"]
    prompt_length = len(remote_model.tokenizer(PROMPT)["input_ids"])
    assert output.shape[-1] == prompt_length + 3
    assert [int(t) for t in tokens] == output[0, prompt_length:].tolist()


def gradient_of_activation(model, remote):
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].output
        hidden.requires_grad = True
        loss = model.lm_head.output[0, -1].logsumexp(-1)
        with loss.backward():
            grad = hidden.grad.save()
    return {"grad": grad}


def test_gradients_on_an_activation(server, remote_model, local_model):
    grad = both(gradient_of_activation, remote_model, local_model)["grad"]
    assert grad.abs().sum() > 0


def failing_program(model, remote):
    with model.trace(PROMPT, remote=remote):
        hidden = model.transformer.h[0].output.save()
        out_of_range = hidden[0, 1000]  # the user's own mistake
    return {}


def test_exception_in_user_code_comes_back_with_their_traceback(server, remote_model):
    from nnsight.intervention.backends.remote import RemoteError

    with pytest.raises(RemoteError) as caught:
        failing_program(remote_model, True)
    message = str(caught.value)
    assert "IndexError" in message
    assert "out_of_range = hidden[0, 1000]" in message
    assert __file__ in message
    assert "site-packages" not in message and "nnhost/execution" not in message
    # ... and the deployment goes on serving.
    trace_with_saves(remote_model, True)


def test_non_blocking_submit_then_poll(server, remote_model, local_model):
    import time

    with remote_model.trace(PROMPT, remote=True, blocking=False) as tracer:
        logits = remote_model.lm_head.output.save()
    backend = tracer.backend
    assert backend.job_id
    result = None
    deadline = time.monotonic() + 60
    while result is None and time.monotonic() < deadline:
        result = backend()
        time.sleep(0.1)
    assert result is not None, f"job never completed; last status {backend.status}"
    assert_same(result, {"logits": trace_with_saves(local_model, False)["logits"]})


def collect_async(model, program_prompt):
    """Run a trace through the async backend, returning every raw update and the saves."""
    from nnsight.intervention.backends.remote import AsyncRemoteBackend

    backend = AsyncRemoteBackend(model.to_model_key())
    with model.trace(program_prompt, backend=backend):
        print("first line from the user")
        time.sleep(1.5)
        print("second line", 2 + 2)
        logits = model.lm_head.output.save()

    async def consume():
        updates = []
        async for update in backend:
            updates.append((time.monotonic(), update))
        return updates

    return asyncio.run(consume())


import time  # noqa: E402  (used inside the traced block above, as a user would)


def test_async_backend_streams_lifecycle_and_prints_live(server, remote_model, local_model):
    updates = collect_async(remote_model, PROMPT)
    result = updates[-1][1]
    assert isinstance(result, dict)
    statuses = [u.status.value for _, u in updates[:-1]]
    assert statuses[0] == "QUEUED" and statuses[-1] == "COMPLETED", statuses
    assert statuses.index("DISPATCHED") < statuses.index("RUNNING") < statuses.index("COMPLETED")
    logs = [(at, u.description) for at, u in updates[:-1] if u.status.value == "LOG"]
    assert [text for _, text in logs] == ["first line from the user", "second line 4"]
    # The first print reached the client while the job was still sleeping,
    # not batched with the result.
    completed_at = updates[-2][0]
    assert completed_at - logs[0][0] > 1.0
    completed = updates[-2][1]
    assert completed.meta["runtime"] >= 1.5 and "peak_memory_bytes" in completed.meta
    # The job's own phases around its run: reading the request, writing the result.
    assert completed.meta["deserialize_seconds"] >= 0 and completed.meta["serialize_seconds"] >= 0
    assert_same(result, {"logits": trace_with_saves(local_model, False)["logits"]})


def large_result(model, remote):
    with model.trace(PROMPT, remote=remote):
        generator = torch.Generator().manual_seed(0)
        big = torch.randn(6_000_000, generator=generator).save()  # 24 MB
        logits = model.lm_head.output.save()
    return {"big": big, "logits": logits}


def test_large_result_goes_by_url(server, remote_model, local_model, compress):
    from nnsight.intervention.backends.remote import AsyncRemoteBackend

    both(large_result, remote_model, local_model)
    # Look at how it travelled: a link, not bytes on the websocket.
    backend = AsyncRemoteBackend(remote_model.to_model_key())
    with remote_model.trace(PROMPT, backend=backend):
        big = torch.randn(6_000_000).save()

    async def consume():
        return [update async for update in backend]

    updates = asyncio.run(consume())
    completed = updates[-2]
    assert isinstance(completed.data, str) and "/result/" in completed.data
    assert updates[-1]["big"].shape == (6_000_000,)


def test_small_result_rides_inline(server, remote_model):
    from nnsight.intervention.backends.remote import AsyncRemoteBackend

    backend = AsyncRemoteBackend(remote_model.to_model_key())
    with remote_model.trace(PROMPT, backend=backend):
        logits = remote_model.lm_head.output.save()

    async def consume():
        return [update async for update in backend]

    updates = asyncio.run(consume())
    assert isinstance(updates[-2].data, bytes)


def attention_in_use(model, remote):
    with model.trace(PROMPT, remote=remote):
        implementation = nnsight.save(model.config._attn_implementation)
    return implementation


def test_request_env_does_not_leak_into_the_next_request(server, remote_model):
    import warnings

    from nnsight import LanguageModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = LanguageModel(remote_model.repo_id, attn_implementation="eager")
    assert eager._remoteable_get_env()["attn_implementation"] == "eager"
    default = remote_model._remoteable_get_env()["attn_implementation"]
    assert default != "eager"
    assert attention_in_use(eager, True) == "eager"
    assert attention_in_use(remote_model, True) == default


def test_time_limit_stops_a_runaway_loop_and_the_model_keeps_serving(
    server, remote_model, local_model
):
    from nnsight.intervention.backends.remote import RemoteError

    with pytest.raises(RemoteError, match="time limit of 8 seconds"):
        with remote_model.trace(PROMPT, remote=True):
            while True:
                pass
    both(trace_with_saves, remote_model, local_model)


def test_time_limit_kills_code_that_swallows_the_interrupt(server, remote_model, local_model):
    from nnsight.intervention.backends.remote import RemoteError

    with pytest.raises(RemoteError, match="worker process was killed"):
        with remote_model.trace(PROMPT, remote=True):
            while True:
                try:
                    while True:
                        pass
                except BaseException:
                    pass
    # The worker is restarted and the next request runs (once the model is back).
    server.wait_running(120)
    both(trace_with_saves, remote_model, local_model)


def test_code_shipped_by_value_with_register(server, remote_model, local_model, tmp_path, monkeypatch):
    """A helper module the server does not have travels with the request."""
    (tmp_path / "nnhost_user_helpers.py").write_text(
        "import torch\n\n"
        "def top_tokens(logits, k=3):\n"
        "    return torch.topk(logits[0, -1], k).indices\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import nnhost_user_helpers

    nnsight.register(nnhost_user_helpers)

    def program(model, remote):
        with model.trace(PROMPT, remote=remote):
            top = nnhost_user_helpers.top_tokens(model.lm_head.output).save()
        return {"top": top}

    both(program, remote_model, local_model)

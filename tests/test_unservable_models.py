"""A model key the server has no engine for is refused up front, naming what it serves.

nnsight's ``VLLM`` wrapper keys itself ``nnsight.modeling.vllm.vllm.VLLM:<repo id>``.
vLLM is not installed on this machine (nor configured on the server), so the
client cannot build the wrapper itself; the request is sent by the client's own
`RemoteBackend` under the key the wrapper mints (`Remotable.to_model_key`:
the class's import path, a colon, then `VLLM._remoteable_model_key`, the repo id).
"""

from __future__ import annotations

import pytest
from conftest import TEST_REPO
from nnsight.intervention.backends.remote import RemoteBackend, RemoteError
from nnsight.modeling.vllm import VLLM
from nnsight.util import to_import_path


def test_a_vllm_request_is_refused_naming_what_is_served(server, remote_model):
    vllm_key = f"{to_import_path(VLLM)}:{TEST_REPO}"
    with pytest.raises(RemoteError) as refused:
        with remote_model.trace("Hello", backend=RemoteBackend(vllm_key)):
            out = remote_model.lm_head.output.save()
    message = str(refused.value)
    assert "VLLM" in message and "no engine" in message
    # What is served instead: the class it is loaded as, and the model.
    assert "TransformersModel" in message and TEST_REPO in message
    # Not mistaken for a malformed key: the key is VLLM's own, well-formed.
    assert "invalid" not in message.lower()


def test_an_unknown_wrapper_class_is_refused_the_same_way(server, remote_model):
    key = 'my.own.Wrapper:{"repo_id": "%s"}' % TEST_REPO
    with pytest.raises(RemoteError) as refused:
        with remote_model.trace("Hello", backend=RemoteBackend(key)):
            out = remote_model.lm_head.output.save()
    assert "Wrapper" in str(refused.value) and TEST_REPO in str(refused.value)

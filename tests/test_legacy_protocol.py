"""The pieces that serve nnsight 0.6 and 0.7 clients, one by one (no server).

End to end, with the real clients, they are shown in `test_runtimes`,
`test_model_kinds` and `security/test_legacy_payloads`. Here: which
deployment and wrapper their model keys name, what their updates look like,
which versions speak their protocol, and how the job side compiles a
shipped function (never running it) and recognises nnsight's own source.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import time
import uuid
from types import SimpleNamespace

import pytest
import torch

from nnhost.api import legacy
from nnhost.client_versions import socketio_era
from nnhost.execution.nnsight_api import LEGACY_WRAPPERS, TRANSFORMERS_CLASS, legacy_model_key
from nnhost.execution.unpickling.allowlist import RefusedPayload
from nnhost.execution.unpickling.legacy import function_code, library_module
from nnhost.jobs.bus import LocalEventBus
from nnhost.jobs.bus_redis import SessionOwner
from nnhost.jobs.update import JobUpdate
from nnhost.models.catalog import ModelKey
from nnhost.wire import Response

REPO = '{"repo_id": "org/model", "revision": null}'


@pytest.mark.parametrize("wrapper,task", [
    ("nnsight.modeling.language.LanguageModel", "text-generation"),
    ("nnsight.modeling.vlm.VisionLanguageModel", "image-text-to-text"),
    ("nnsight.modeling.huggingface.HuggingFaceModel", None),
])
def test_an_older_clients_key_names_the_deployment_of_its_task(wrapper, task):
    key = ModelKey.parse(f"{wrapper}:{REPO}")
    assert (key.model_class, key.repo_id, key.task) == (TRANSFORMERS_CLASS, "org/model", task)


def test_a_diffusion_key_is_the_same_in_both_generations():
    key = ModelKey.parse(f"nnsight.modeling.diffusion.DiffusionModel:{REPO}")
    assert key.model_class == "nnsight.modeling.diffusion.DiffusionModel"


@pytest.mark.parametrize("task", sorted(LEGACY_WRAPPERS))
def test_a_runtime_builds_the_wrapper_an_older_client_pickles(task):
    key, extra = legacy_model_key(f'{TRANSFORMERS_CLASS}:{{"repo_id": "org/model", "revision": null, "task": "{task}"}}')
    wrapper, data = key.split(":", 1)
    assert wrapper == LEGACY_WRAPPERS[task] and extra == {}
    assert json.loads(data) == {"repo_id": "org/model", "revision": None}


def test_another_task_is_their_transformers_model_with_its_auto_class():
    from transformers import AutoModelForMaskedLM

    key, extra = legacy_model_key(f'{TRANSFORMERS_CLASS}:{{"repo_id": "org/model", "revision": null, "task": "fill-mask"}}')
    assert key.split(":", 1)[0] == TRANSFORMERS_CLASS and "task" not in key
    assert extra == {"automodel": AutoModelForMaskedLM}
    with pytest.raises(ValueError, match="no wrapper"):
        legacy_model_key(f'{TRANSFORMERS_CLASS}:{{"repo_id": "org/model", "task": "no-such-task"}}')


def test_the_versions_that_speak_the_older_protocol():
    assert [socketio_era(v) for v in ("0.6.3", "0.7.0", "0.7.1rc1", "0.8.0", "0.8.1", "", "dev")] == [
        True, True, True, False, False, False, False]


def test_their_statuses_are_the_ones_they_know():
    for ours, theirs in [("DEPLOYING", "QUEUED"), ("PROVISIONING", "QUEUED"), ("LOG", "LOG"),
                         ("RUNNING", "RUNNING"), ("ERROR", "ERROR")]:
        assert legacy.their_response(Response(id="j", status=ours, description="d")).status == theirs


def test_a_completed_update_carries_the_link_even_when_the_result_rode_inline():
    signed = []
    server = SimpleNamespace(
        settings=SimpleNamespace(public_url=""),
        results=SimpleNamespace(signed_url=lambda job, ttl, base: signed.append(job) or f"{base}/result/{job}?s=1"),
    )
    job_id = uuid.uuid4().hex
    update = JobUpdate(job_id=job_id, status="COMPLETED", description="done", base_url="http://h:1",
                       result_expires_at=time.time() + 600, inline=b"result bytes", meta={"runtime": 0.1})
    event = torch.load(io.BytesIO(legacy.update_event(server, update)), weights_only=False)
    assert event["id"] == job_id and event["status"] == "COMPLETED"
    assert event["data"] == f"http://h:1/result/{job_id}?s=1" and signed == [job_id]


def test_their_request_is_read_from_its_headers():
    submission = legacy.submission({"nnsight-model-key": "k", "nnsight-compress": "True", "ndif-session_id": "s"})
    assert (submission.model_key, submission.compress, submission.session_id, submission.env) == ("k", True, "s", {})
    assert legacy.submission({}).compress is False


def test_a_socketio_session_may_be_named_by_any_request_that_knows_its_id():
    async def sessions():
        bus = LocalEventBus()
        session = await bus.open(None, session_id="sid-1", anyone=True)
        return session, await bus.owner("sid-1"), await bus.open(7)

    session, owner, keyed = asyncio.run(sessions())
    assert session.id == "sid-1" and owner is session and owner.anyone and not keyed.anyone
    assert SessionOwner.model_validate_json(SessionOwner(user_id=None, anyone=True).model_dump_json()).anyone


def test_a_shipped_function_is_compiled_without_running_a_line_of_it():
    source = "@print\ndef f(x, y=print('default')):\n    return x + offset\n"
    code = function_code(source, "f", ("offset",), "<user>")
    assert code.co_name == "f" and code.co_freevars == ("offset",)
    lambda_code = function_code("lambda v: v * k", "<lambda>", ("k",), "<user>")
    assert lambda_code.co_freevars == ("k",)


@pytest.mark.parametrize("source,name", [
    ("x = 1\ndef f():\n    pass\n", "f"),
    ("def g():\n    pass\n", "f"),
    ("lambda: 1\nlambda: 2\n", "<lambda>"),
])
def test_source_that_is_not_one_definition_of_the_function_is_refused(source, name):
    with pytest.raises(RefusedPayload):
        function_code(source, name, (), "<user>")


def test_nnsights_own_source_is_recognised_only_as_it_is_at_its_place():
    from nnsight.intervention import serialization

    function = serialization.dumps
    lines, first = inspect.getsourcelines(function)
    source = "".join(lines)
    path = "/home/someone/venv/lib/python3.11/site-packages/nnsight/intervention/serialization.py"
    assert library_module(path, source, first) is serialization
    assert library_module(path, source.replace("return", "return  "), first) is None
    assert library_module(path, source, first + 1) is None
    assert library_module("/home/someone/nnsight/../../etc/passwd.py", source, first) is None
    assert library_module("/home/someone/script.py", source, first) is None

"""Small parts on their own: lifecycle rules, fair queue order, retention, links, capture."""

from __future__ import annotations

import asyncio
import time

import pytest

from nnhost.config import Settings
from nnhost.controller.scheduler import FairQueue
from nnhost.controller.service import JobService
from nnhost.execution.job.capture import capture_stdout
from nnhost.jobs.job import InvalidTransition, Job, Status
from nnhost.jobs.store import JobStore, connect
from nnhost.models.catalog import InvalidModelKey, ModelKey, ModelSpec
from nnhost.storage.links import LinkSigner
from nnhost.storage.results import DirectoryStore


def test_lifecycle_refuses_impossible_histories(database_url):
    store = JobStore(connect(database_url))
    store.create(Job(id="a1", user_id=1, model_key="k", deployment="d"))
    with pytest.raises(InvalidTransition):
        store.transition("a1", Status.COMPLETED, "too early")
    for status in (Status.QUEUED, Status.DISPATCHED, Status.RUNNING, Status.COMPLETED):
        store.transition("a1", status, status.value)
    with pytest.raises(InvalidTransition):
        store.transition("a1", Status.ERROR, "after the end")
    assert store.get("a1").status is Status.COMPLETED
    store.database.close()


def test_fair_queue_round_robins_users_and_keeps_each_users_order():
    queue = FairQueue()
    for i in range(5):
        queue.push("alice", f"a{i}")
    queue.push("bob", "b0")
    queue.push("bob", "b1")
    assert queue.order() == ["a0", "b0", "a1", "b1", "a2", "a3", "a4"]
    assert [queue.pop() for _ in range(7)] == ["a0", "b0", "a1", "b1", "a2", "a3", "a4"]
    assert queue.pop() is None


def test_model_keys_match_however_the_client_spells_them():
    spec = ModelSpec("org/name")
    key = ModelKey.parse(
        'nnsight.modeling.transformers.TransformersModel:{"task": "text-generation", '
        '"revision": "main", "repo_id": "org/name"}'
    )
    assert key == spec.key == ModelKey.parse(spec.model_key())
    with pytest.raises(InvalidModelKey):
        ModelKey.parse("nnsight.X:{not json}")


def test_expired_results_are_deleted_and_links_expire(tmp_path):
    store = JobStore(connect(tmp_path / "db.sqlite3"))
    results = DirectoryStore(tmp_path / "results", LinkSigner(b"secret"))
    service = JobService(Settings(), store, None, None, None, None, results)
    for job_id, expires in (("old", time.time() - 1), ("new", time.time() + 3600)):
        store.create(Job(id=job_id, user_id=1, model_key="k", deployment="d"))
        for status in (Status.QUEUED, Status.DISPATCHED, Status.RUNNING):
            store.transition(job_id, status, "")
        results.write(job_id, b"result bytes")
        store.transition(job_id, Status.COMPLETED, "", result_size=12, result_expires_at=expires)
    assert asyncio.run(service.sweep_results()) == 1
    assert not results.exists("old") and results.exists("new")
    assert store.get("old").result_expires_at is None

    signer = LinkSigner(b"secret")
    assert signer.verify("new", int(time.time()) + 60, signer.sign("new", int(time.time()) + 60))
    past = int(time.time()) - 1
    assert not signer.verify("new", past, signer.sign("new", past))
    future = int(time.time()) + 60
    assert not signer.verify("other", future, signer.sign("new", future))


def test_print_capture_sends_each_line_and_caps_a_flood():
    lines = []
    with capture_stdout(lines.append, max_lines=3):
        print("one")
        print("two", "three")
        print("partial", end="")
        print(" done")
        for i in range(100):
            print(i)
    assert lines[:3] == ["one", "two three", "partial done"]
    assert "limit of 3 printed lines" in lines[3]
    assert len(lines) == 4


def test_fair_queue_charges_by_runtime_and_serves_priority_first():
    now = [0.0]
    queue = FairQueue(clock=lambda: now[0])
    queue.push("heavy", "h0")
    queue.push("light", "l0")
    assert queue.pop() == "h0"
    now[0] += 30.0
    queue.finished("h0")  # heavy held the replica 30 s: light goes next, twice
    queue.push("heavy", "h1")
    queue.push("light", "l1")
    assert [queue.pop(), queue.pop()] == ["l0", "l1"]
    assert queue.pop() == "h1"
    queue.push("normal", "n0")
    queue.push("vip", "v0", priority=True)
    assert queue.order() == ["v0", "n0"]
    # A user who was idle re-enters at the current clock, not with banked credit.
    assert queue.pop() == "v0"


def test_catalog_from_toml_and_trust_remote_code_needs_the_operator(tmp_path, monkeypatch):
    from nnhost.app import build_catalog
    from nnhost.config import load_settings
    from nnhost.models.tiny import build_tiny_gpt2

    home = tmp_path / "hf"
    build_tiny_gpt2("org/listed", hf_home=home)
    monkeypatch.setenv("HF_HOME", str(home))
    (tmp_path / "nnhost.toml").write_text(
        "[server]\nmemory_margin = 0.5\n\n"
        "[[model]]\nrepo_id = 'org/listed'\ndeploy = 'cold'\ndtype = 'float16'\n\n"
        "[[model]]\nrepo_id = 'org/remote-code'\ntrust_remote_code = true\n"
    )
    settings = load_settings({"data_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="allow_trust_remote_code"):
        build_catalog(settings)
    settings.allow_trust_remote_code = True
    catalog = build_catalog(settings)
    listed = catalog.specs["org/listed"]
    assert listed.deploy == "cold" and listed.dtype == "float16"
    # Sized from the checkpoint's headers: float32 weights held as float16, plus 50%.
    from nnhost.models.hfcache import find_snapshot
    from nnhost.models.sizing import weight_bytes

    stored = weight_bytes(find_snapshot("org/listed", None, home))
    assert listed.size_bytes == int(stored / 2 * 1.5)
    assert catalog.specs["org/remote-code"].size_bytes is None  # not cached: unknown

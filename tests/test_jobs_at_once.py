"""Several jobs of one replica run at once, each in its own process (issue 23).

A replica of the fork or mapped design forks each job's process from the one
that holds the weights, so jobs need not wait for each other: up to
``jobs_at_once`` run side by side (`replicas.slots.JobProcesses.capacity`).
Run one at a time, the next job process sat idle while the server recorded
one job and dispatched the next. The unit tests drive the slot bookkeeping
with fake job processes; the end-to-end test sends two sleeping traces to a
real server and reads, from the times the server recorded, whether the second
was handed to its process before the first had finished.
"""

from __future__ import annotations

import io
import json
import threading
import time
import warnings

import httpx
import pytest
import torch
from conftest import API_KEY, sleeping_payload
from fakes import BareReplicaSide, FakeJobProcess

from nnhost.execution.events import JobSpec
from nnhost.execution.messages import Event, Warm
from nnhost.execution.policy import WorkerPolicy
from nnhost.models.sizing import jobs_per_replica, threads_per_job
from nnhost.replicas.slots import JobProcesses
from nnhost.testing import ServerProcess, free_port

REPO = "nnhost-test/jobs-at-once"
PROMPT = "The Eiffel Tower is in the city of"


# -- the defaults -----------------------------------------------------------------------

def test_half_the_cores_at_least_two_on_the_cpu_and_one_on_an_accelerator():
    assert jobs_per_replica(0, "cpu", cores=2) == 2
    assert jobs_per_replica(0, "cpu", cores=16) == 8
    assert jobs_per_replica(0, "cpu", cores=1) == 2
    assert jobs_per_replica(0, "cuda:0", cores=16) == 1
    assert jobs_per_replica(3, "cuda:0", cores=16) == 3  # the operator's number wins
    # The threads are split between every job that can run at once.
    assert threads_per_job(0, jobs_per_replica(0, "cpu", cores=16), cores=16) == 1
    assert threads_per_job(0, 1, cores=16) == 15


# -- the bookkeeping ----------------------------------------------------------------------

def _spec(tmp_path, n: int) -> JobSpec:
    (tmp_path / f"payload-{n}").write_bytes(b"x")
    return JobSpec(f"{n:032d}", str(tmp_path / f"payload-{n}"), False, result_path=str(tmp_path / f"result-{n}"))


def _finish(jobs: JobProcesses, process: FakeJobProcess, spec: JobSpec, tmp_path, n: int) -> None:
    assert jobs._slot_message(process.slot, Event(job_id=spec.job_id, status="RUNNING", description="r"), [])
    (tmp_path / f"result-{n}").write_bytes(b"r")
    jobs._slot_message(process.slot, Event(job_id=spec.job_id, status="COMPLETED", description="c",
                                           result_size=1), [])


def test_two_jobs_run_at_once_a_third_waits_and_the_warm_up_waits_for_both(tmp_path):
    idle = []
    jobs = JobProcesses("org/a", WorkerPolicy(), threading.RLock(), BareReplicaSide(),
                        on_job_event=lambda event: None, on_idle=lambda: idle.append(1),
                        on_incident=lambda kind: None)
    jobs.capacity = 2
    first, second, third = (_spec(tmp_path, n) for n in (1, 2, 3))
    a = FakeJobProcess(jobs, 101)
    jobs.submit(first)  # none waits behind it: its successor is to warm up, later
    assert jobs.has_room and jobs.spare is None
    b = FakeJobProcess(jobs, 102)  # the job process asked for at the first job's dispatch
    assert jobs.spare is b.slot and jobs.has_room
    jobs.submit(second)
    assert [slot.job.job_id for slot in jobs.running] == [first.job_id, second.job_id]
    assert not jobs.has_room  # a third job waits, even with a process ready for it
    c = FakeJobProcess(jobs, 103)
    assert jobs.spare is c.slot and not jobs.has_room
    _finish(jobs, a, first, tmp_path, 1)
    assert jobs.has_room and [slot.job.job_id for slot in jobs.running] == [second.job_id]
    assert c.told() == []  # not beside the second job, which still runs
    jobs.submit(third)
    assert jobs.running[-1] is c.slot
    _finish(jobs, b, second, tmp_path, 2)
    _finish(jobs, c, third, tmp_path, 3)
    assert jobs.running == [] and jobs.has_room
    d = FakeJobProcess(jobs, 104)
    assert [type(message) for message in d.told()] == [Warm]  # ready once nothing runs
    assert len(idle) >= 3
    for process in (a, b, c, d):
        process.close()


# -- end to end -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def snapshot(root):
    from nnhost.models.tiny import build_tiny_gpt2

    home = root / "jobs-at-once-hf"
    return home, build_tiny_gpt2(REPO, hf_home=home)


@pytest.mark.parametrize("at_once", [1, 2])
def test_a_replica_runs_as_many_jobs_at_once_as_it_is_set_to(root, snapshot, at_once):
    from nnsight import LanguageModel

    home, path = snapshot
    headers = {"ndif-api-key": API_KEY, "nnsight-version": "0.8.1"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LanguageModel(str(path), dispatch=True)
    with torch.no_grad():
        expected = model._module(**model.tokenizer(PROMPT, return_tensors="pt")).logits[:, -1]
    blob = sleeping_payload(model, PROMPT, 1.5)
    server = ServerProcess([REPO], data_dir=root / f"jobs-at-once-{at_once}", hf_home=home, api_key=API_KEY,
                           port=free_port(), extra_args=["--jobs-at-once", str(at_once)]).start()
    try:
        key = json.dumps({"repo_id": REPO, "revision": None, "task": "text-generation"})
        data = {"data": json.dumps({"model_key": f"nnsight.modeling.transformers.TransformersModel:{key}"})}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
            ids = [http.post("/request", data=data, files={"blob": ("request", blob)}).json()["id"]
                   for _ in range(2)]
            deadline = time.monotonic() + 120
            latest, shown_running = {}, set()
            while time.monotonic() < deadline:
                latest = {job_id: http.get(f"/response/{job_id}").json() for job_id in ids}
                if all(reply["status"] in ("COMPLETED", "ERROR") for reply in latest.values()):
                    break
                # What the status page says runs (its board counts jobs, not busy replicas).
                shown_running |= {model["running"] for model in http.get("/api/overview").json()["models"]}
                time.sleep(0.1)
            for reply in latest.values():
                assert reply["status"] == "COMPLETED", reply
                result = torch.load(io.BytesIO(httpx.get(reply["data"]).content), weights_only=False)
                assert torch.allclose(result["logits"], expected, atol=1e-6)
            rows = {job["id"]: job for job in http.get("/admin/jobs").json()["jobs"] if job["id"] in ids}
        first, second = sorted(rows.values(), key=lambda job: job["started_at"])
        # The server's own marks: the second job was handed to its process
        # before the first had finished, or only after.
        overlapped = second["started_at"] < first["updated_at"]
        assert overlapped is (at_once == 2), (first, second)
        assert max(shown_running) == at_once, shown_running
    finally:
        server.stop()

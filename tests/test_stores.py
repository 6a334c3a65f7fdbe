"""The job and account stores on each database the server supports (SQLite and PostgreSQL).

Every test here runs twice through the ``database_url`` fixture: once on a
SQLite file, once on a fresh database of the suite's own PostgreSQL server.
"""

from __future__ import annotations

import threading
import time

import pytest

from nnhost.auth.invites import InviteStore
from nnhost.auth.keys import KeyProblem, KeyStore, UserExists
from nnhost.auth.sessions import SessionStore
from nnhost.jobs.job import InvalidTransition, Job, Status
from nnhost.jobs.store import JobStore, LogLine, Transition, connect


@pytest.fixture
def database(database_url):
    database = connect(database_url)
    yield database
    database.close()


def _job(job_id: str, user_id: int = 1, deployment: str = "org/model", **fields) -> Job:
    return Job(id=job_id, user_id=user_id, model_key="k", deployment=deployment, **fields)


def _walk(store: JobStore, job_id: str, *statuses: Status) -> None:
    for status in statuses:
        store.transition(job_id, status, status.value)


def test_a_job_round_trips_every_field(database):
    store = JobStore(database)
    store.create(_job("j1", session_id="s", compress=True, env={"torch": "2"}, meta={"a": [1, 2]},
                      base_url="http://x"))
    job = store.get("j1")
    assert (job.session_id, job.compress, job.env, job.meta, job.base_url) == (
        "s", True, {"torch": "2"}, {"a": [1, 2]}, "http://x")
    assert job.status is Status.RECEIVED and job.created_at == job.updated_at > 0
    assert store.get("missing") is None


def test_transitions_follow_the_lifecycle_and_keep_the_result_fields(database):
    store = JobStore(database)
    store.create(_job("j1"))
    with pytest.raises(InvalidTransition):
        store.transition("j1", Status.COMPLETED, "too early")
    _walk(store, "j1", Status.QUEUED, Status.DISPATCHED, Status.RUNNING)
    big = 5 * 1024**3  # past 32 bits: results may be GiBs
    done = store.transition("j1", Status.COMPLETED, "done", meta={"runtime": 1.5},
                            result_size=big, result_expires_at=time.time() + 60)
    stored = store.get("j1")
    assert stored == done and stored.result_size == big and stored.meta == {"runtime": 1.5}
    with pytest.raises(InvalidTransition):
        store.transition("j1", Status.ERROR, "after the end")
    with pytest.raises(KeyError):
        store.transition("nope", Status.QUEUED, "")


def test_queries_by_status_user_deployment_and_expiry(database):
    store = JobStore(database)
    for index, (user, deployment) in enumerate([(1, "a"), (2, "a"), (1, "b"), (1, "a")]):
        store.create(_job(f"j{index}", user_id=user, deployment=deployment))
        time.sleep(0.002)  # distinct creation times, for the order
    _walk(store, "j1", Status.QUEUED)
    _walk(store, "j2", Status.ERROR)
    assert [job.id for job in store.with_status([Status.RECEIVED, Status.QUEUED])] == ["j0", "j1", "j3"]
    assert [job.id for job in store.for_user(1)] == ["j3", "j2", "j0"]
    assert [job.id for job in store.for_user(1, limit=1)] == ["j3"]
    assert store.unfinished_count(1) == 2 and store.unfinished_count(2) == 1
    assert [job.id for job in store.search(user_id=1, deployment="a")] == ["j3", "j0"]
    assert [job.id for job in store.search(status=Status.ERROR)] == ["j2"]
    assert len(store.search(limit=2)) == 2
    _walk(store, "j3", Status.QUEUED, Status.DISPATCHED, Status.RUNNING)
    assert store.unfinished_count(1) == 2  # running is not finished
    store.transition("j3", Status.COMPLETED, "", result_size=1, result_expires_at=time.time() - 1)
    assert store.unfinished_count(1) == 1
    assert [job.id for job in store.expired_results(time.time())] == ["j3"]
    store.forget_result("j3")
    assert store.expired_results(time.time()) == [] and store.get("j3").result_size == 1


def test_log_lines_keep_their_order_and_any_text(database):
    store = JobStore(database)
    lines = [f"line {i}" for i in range(50)] + ["nul \x00 inside", "lone \ud800 surrogate", "ünïcødé"]
    for line in lines:
        store.add_log("j1", line)
    store.add_log("j2", "other")
    kept = store.logs("j1")
    assert kept[:50] == lines[:50] and kept[52] == "ünïcødé"
    assert kept[50] == "nul \ufffd inside" and kept[51] == "lone ? surrogate"
    store.delete_logs("j1")
    assert store.logs("j1") == [] and store.logs("j2") == ["other"]
    assert store.delete_logs_before(time.time() + 1) == 1


def test_a_batch_of_writes_is_one_commit_and_a_refused_transition_writes_nothing(database):
    """The controller's writer stores a burst (a job's RUNNING, its LOG lines, its end)
    with one commit, not one per line; a transition the lifecycle forbids is
    answered with its refusal, and the writes around it are stored."""
    from sqlalchemy import event

    store = JobStore(database)
    store.create(_job("j1"))
    store.create(_job("j2"))
    commits = []
    event.listen(database.engine, "commit", lambda connection: commits.append(1))
    lines = [f"line {n}" for n in range(64)]
    applied = store.apply([
        Transition("j1", Status.QUEUED, "queued"),
        *(LogLine("j1", line) for line in lines[:32]),
        Transition("j2", Status.COMPLETED, "not from RECEIVED"),
        Transition("nobody", Status.QUEUED, "no such job"),
        *(LogLine("j1", line) for line in lines[32:]),
        Transition("j1", Status.DISPATCHED, "dispatched", {"started": True}),
    ])
    assert len(commits) == 1
    assert isinstance(applied[33], InvalidTransition) and isinstance(applied[34], KeyError)
    assert applied[1:33] == [True] * 32 and applied[35:-1] == [True] * 32
    assert applied[-1] == store.get("j1") and applied[-1].status is Status.DISPATCHED
    assert applied[-1].started_at is not None
    assert store.logs("j1") == lines
    assert store.get("j2").status is Status.RECEIVED


def test_concurrent_transitions_of_one_job_let_exactly_one_win(database):
    """Two threads (two pooled connections) race to fail and complete the same job."""
    store, other = JobStore(database), JobStore(database)  # two stores: no shared lock
    outcomes = []
    for index in range(10):
        job_id = f"race{index}"
        store.create(_job(job_id))
        _walk(store, job_id, Status.QUEUED, Status.DISPATCHED, Status.RUNNING)
        barrier = threading.Barrier(2)

        def finish(target, status, barrier=barrier, job_id=job_id):
            barrier.wait()
            try:
                target.transition(job_id, status, status.value)
                outcomes.append(status)
            except InvalidTransition:
                outcomes.append(None)

        threads = [threading.Thread(target=finish, args=(store, Status.COMPLETED)),
                   threading.Thread(target=finish, args=(other, Status.ERROR))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [status for status in outcomes[-2:] if status is not None]
        assert len(winners) == 1 and store.get(job_id).status is winners[0]


def test_users_and_keys(database):
    keys = KeyStore(database)
    assert keys.user_count() == 0
    ada = keys.add_user(" Ada@Example.org ", ["Admin", "trusted", "admin"], password_hash="h")
    with pytest.raises(UserExists):
        keys.add_user("ada@example.org")
    bob = keys.add_user("bob@example.org")
    assert keys.user_count() == 2 and [user.email for user in keys.users()] == [
        "ada@example.org", "bob@example.org"]
    assert keys.user_by_email("ADA@example.org").tags == ("admin", "trusted")
    assert keys.user(ada).has_password and not keys.user(bob).has_password
    assert keys.login_record("ada@example.org")[1:] == ("h", False)

    key = keys.create_key(ada, name="laptop")
    other = keys.create_key(bob, expires_at=time.time() - 1)
    assert keys.has_key(key) and not keys.has_key(key + "x")
    check = keys.check(key)
    assert check.principal.user_id == ada and check.principal.is_admin
    assert keys.keys(ada)[0].last_used_at is not None
    assert keys.check(other).problem is KeyProblem.EXPIRED
    assert keys.check("nnh_unknown").problem is KeyProblem.UNKNOWN
    assert keys.check(None).problem is KeyProblem.MISSING
    assert [info.email for info in keys.keys()] == ["bob@example.org", "ada@example.org"]
    (info,) = keys.find_keys(key[:12])
    assert info.name == "laptop" and keys.find_keys(str(info.id)) == [info]

    assert not keys.revoke_key(info.id, user_id=bob)  # not bob's
    assert keys.revoke_key(info.id) and not keys.revoke_key(info.id)
    assert keys.check(key).problem is KeyProblem.REVOKED
    fresh = keys.create_key(bob)
    keys.set_disabled(bob, True)
    assert keys.check(fresh).problem is KeyProblem.DISABLED and keys.principal(bob) is None
    keys.set_disabled(bob, False)
    keys.set_tags(bob, ["priority"])
    keys.set_password_hash(bob, "p")
    assert keys.principal(bob).tags == ("priority",) and keys.user(bob).has_password


def test_sessions_and_invites(database):
    keys = KeyStore(database)
    ada = keys.add_user("ada@example.org")
    sessions = SessionStore(database, keys, ttl=60)
    token = sessions.create(ada)
    assert sessions.principal(token).user_id == ada
    assert sessions.principal("forged") is None and sessions.principal(None) is None
    keys.set_disabled(ada, True)
    assert sessions.principal(token) is None
    keys.set_disabled(ada, False)
    sessions.end(token)
    assert sessions.principal(token) is None
    second = sessions.create(ada)
    sessions.end_all(ada)
    assert sessions.principal(second) is None
    assert SessionStore(database, keys, ttl=-1).principal(SessionStore(database, keys, ttl=-1).create(ada)) is None

    invites = InviteStore(database)
    code = invites.create(["trusted"], note="for bob")
    expired = invites.create(expires_at=time.time() - 1)
    assert invites.claim(expired) is None and invites.claim("") is None
    claimed = invites.claim(code)
    assert claimed.tags == ("trusted",) and claimed.state() == "used"
    assert invites.claim(code) is None  # one sign-up per code
    invites.release(claimed.id)
    again = invites.claim(code)
    bob = keys.add_user("bob@example.org", again.tags)
    invites.bind(again.id, bob)
    invites.release(again.id)  # bound: stays used
    assert [(i.note, i.used_by) for i in invites.all()] == [("for bob", bob), ("", None)]

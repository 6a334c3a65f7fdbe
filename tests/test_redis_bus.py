"""Job updates over a real Redis: a session held by one process gets what another publishes.

Two `RedisEventBus` instances stand for two API processes (each has its own
connections, exactly as separate processes would), and a real server started
with ``--events redis://...`` serves the unmodified nnsight client through
it, results equal to a local run.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import API_KEY, TEST_REPO
from service_redis import redis_server  # noqa: F401  (the fixture)

from nnhost.jobs.bus_redis import RedisEventBus
from nnhost.testing import ServerProcess

PROMPT = "The Eiffel Tower is in the city of"


def test_updates_cross_processes_in_order_and_keep_their_type(redis_server):  # noqa: F811
    async def body():
        holder, publisher = RedisEventBus(redis_server.url), RedisEventBus(redis_server.url)
        await holder.start()
        await publisher.start()
        try:
            session = await holder.open(user_id=7)
            seen = await publisher.owner(session.id)
            assert seen is not None and seen.user_id == 7
            assert await publisher.owner("no-such-session") is None
            sent = [f'{{"n": {i}}}' for i in range(200)] + [b"\x80pickled\x00frame"]
            for frame in sent:
                publisher.publish(session.id, frame)
            got = [await asyncio.wait_for(session.next(), 10) for _ in sent]
            assert got == sent and isinstance(got[-1], bytes) and isinstance(got[0], str)
            # Held here: served without Redis, still in order.
            holder.publish(session.id, "local")
            assert await session.next() == "local"
            await holder.close(session.id)
            assert await publisher.owner(session.id) is None
            publisher.publish(session.id, "after close")  # dropped, never raised
            await asyncio.sleep(0.1)
            assert session.queue.empty()
        finally:
            await holder.stop()
            await publisher.stop()

    asyncio.run(body())


def test_garbage_on_a_session_channel_is_dropped(redis_server):  # noqa: F811
    import redis

    async def body():
        bus = RedisEventBus(redis_server.url)
        await bus.start()
        try:
            session = await bus.open(user_id=None)
            raw = redis.Redis.from_url(redis_server.url)
            raw.publish(f"nnhost:session:{session.id}", b"?not a frame")
            raw.set("nnhost:owner:forged", b"{not json")
            bus.publish("elsewhere", "x")
            raw.publish(f"nnhost:session:{session.id}", b"tfine")
            assert await asyncio.wait_for(session.next(), 10) == "fine"
            assert await bus.owner("forged") is None
        finally:
            await bus.stop()

    asyncio.run(body())


@pytest.fixture(scope="module")
def redis_events_server(root, server_hf_home, test_snapshot, server, redis_server):  # noqa: F811
    process = ServerProcess(
        [TEST_REPO], data_dir=root / "redis-events-data", hf_home=server_hf_home, api_key=API_KEY,
        extra_args=["--events", redis_server.url],
    )
    process.start()
    yield process
    process.stop()


def test_the_client_gets_its_updates_through_redis(redis_events_server, remote_model, local_model):
    from compare import assert_identical
    from nnsight import CONFIG

    previous = CONFIG.API.HOST
    CONFIG.API.HOST = redis_events_server.url
    try:
        with remote_model.trace(PROMPT, remote=True):
            remote = remote_model.lm_head.output.save()
            print("through redis")
    finally:
        CONFIG.API.HOST = previous
    with local_model.trace(PROMPT):
        local = local_model.lm_head.output.save()
    assert_identical(remote, local)
    log = redis_events_server.log_path.read_text(errors="replace")
    assert "Traceback" not in log


def test_an_unreachable_redis_stops_serve_with_a_message(root, server_hf_home, test_snapshot):
    import subprocess
    import sys

    from nnhost.testing import free_port

    run = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "serve", TEST_REPO, "--data-dir", str(root / "no-redis"),
         "--port", str(free_port()), "--events", f"redis://127.0.0.1:{free_port()}/0"],
        capture_output=True, text=True, timeout=60,
        env={**__import__("os").environ, "HF_HOME": str(server_hf_home), "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 2
    assert "cannot reach Redis" in run.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "nnhost.cli", "serve", TEST_REPO, "--data-dir", str(root / "no-redis"),
         "--events", "http://example.org"], capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "redis://" in bad.stderr


def test_api_processes_give_a_user_one_request_allowance(redis_server):  # noqa: F811
    """With several API processes a user's requests per minute are counted once, in Redis."""
    from nnhost.auth.limits import LimitPolicy, RequestRate

    limits = LimitPolicy({"t": {"requests_per_minute": 60, "burst": 3}}, max_request_bytes=1).for_tags(("t",))
    first, second = RequestRate(redis_url=redis_server.url), RequestRate(redis_url=redis_server.url)
    assert first.shared and second.shared
    # Three at once in all, whichever process takes them; then a wait of about a second.
    assert [first.take(41, limits), second.take(41, limits), first.take(41, limits)] == [0.0] * 3
    wait = second.take(41, limits)
    assert 0.5 < wait <= 1.0
    assert first.take(42, limits) == 0.0  # another user has their own bucket
    alone = RequestRate()  # without Redis: this process's own bucket
    assert not alone.shared and alone.take(41, limits) == 0.0


def test_api_processes_count_failed_attempts_and_sign_ups_together(redis_server):  # noqa: F811
    """A source's failures (and an address's sign-ups) are one count across API processes."""
    from nnhost.auth.limits import FailureCounter

    first, second = (FailureCounter(3, 60, redis_url=redis_server.url, name="test-failures")
                     for _ in range(2))
    for counter in (first, second, first):
        assert counter.blocked_for("10.0.0.7") == 0.0
        counter.record("10.0.0.7")
    assert 55 < second.blocked_for("10.0.0.7") <= 60  # three in all: blocked in either process
    assert 55 < first.blocked_for("10.0.0.7") <= 60
    assert first.blocked_for("10.0.0.8") == 0.0  # another source has its own count
    other_name = FailureCounter(3, 60, redis_url=redis_server.url, name="test-signups")
    assert other_name.blocked_for("10.0.0.7") == 0.0  # and another counter its own keys
